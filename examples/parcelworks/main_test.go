package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func defaults() Config {
	return Config{HeavySlots: 6, ControlSlots: 2, HeavyQueue: 12, ControlQueue: 4,
		HeavyOffered: 20, ControlOffered: 8, Probes: 4, Timeout: time.Minute}
}

// TestSeedCounts checks the seed's closing counts: 18 heavy and 6 control
// accepted, 4 refused with typed reasons, never more than 8 running, and
// control probes admitted while heavy is saturated.
func TestSeedCounts(t *testing.T) {
	rep, err := Run(defaults())
	require.NoError(t, err)
	h, c := rep.Classes[heavyClass], rep.Classes[controlClass]
	require.Equal(t, 18, h.Accepted)
	require.Equal(t, 6, c.Accepted)
	require.Equal(t, map[string]int{"QUEUE_FULL": 2}, h.Refused)
	require.Equal(t, map[string]int{"QUEUE_FULL": 2}, c.Refused)
	require.EqualValues(t, 8, rep.MaxRunning)
	require.EqualValues(t, 6, h.MaxRunning)
	require.EqualValues(t, 2, c.MaxRunning)
	require.Equal(t, 4, rep.Probes.Admitted)
	require.Len(t, rep.Probes.StartDelaysMs, 4)
	require.Equal(t, 6, rep.Probes.HeavyRunning, "heavy stayed saturated while the probes ran")
	require.Equal(t, 12, rep.Probes.HeavyQueued)
	var out bytes.Buffer
	Print(&out, rep)
	require.Contains(t, out.String(), "accepted 24, refused 4")
}

// TestFlagsChangeCounts checks that the numbers follow the configuration:
// without queues the excess is refused with CONCURRENCY_FULL.
func TestFlagsChangeCounts(t *testing.T) {
	cfg := defaults()
	cfg.HeavyQueue, cfg.ControlQueue, cfg.HeavyOffered, cfg.ControlOffered, cfg.Probes = 0, 0, 9, 3, 1
	rep, err := Run(cfg)
	require.NoError(t, err)
	require.Equal(t, 6, rep.Classes[heavyClass].Accepted)
	require.Equal(t, map[string]int{"CONCURRENCY_FULL": 3}, rep.Classes[heavyClass].Refused)
	require.Equal(t, 2, rep.Classes[controlClass].Accepted)
	require.Equal(t, map[string]int{"CONCURRENCY_FULL": 1}, rep.Classes[controlClass].Refused)
	require.LessOrEqual(t, rep.MaxRunning, int64(8))
	require.Equal(t, 1, rep.Probes.Admitted)
}

// TestProbesAreNotTheBurst: a class's max running reports its burst, as its
// offered and accepted do, while the server's counts the probes too. A
// review found "control offered 0 accepted 0 … max running 1 of 2".
func TestProbesAreNotTheBurst(t *testing.T) {
	cfg := defaults()
	cfg.ControlOffered = 0
	rep, err := Run(cfg)
	require.NoError(t, err)
	c := rep.Classes[controlClass]
	require.Zero(t, c.Accepted)
	require.Zero(t, c.MaxRunning, "no control burst task ran")
	require.Equal(t, 4, rep.Probes.Admitted)
	require.EqualValues(t, 7, rep.MaxRunning, "6 heavy and a probe at a time")
}

// TestNoProbesMeasuresNoDelay: with -probes 0 no start delay is measured,
// so none is reported. A review found "start delays [] (max 0s)" and
// max_start_delay_ms 0 in the JSON, a delay that was never measured.
func TestNoProbesMeasuresNoDelay(t *testing.T) {
	cfg := defaults()
	cfg.Probes = 0
	rep, err := Run(cfg)
	require.NoError(t, err)
	require.Empty(t, rep.Probes.StartDelaysMs)
	require.Nil(t, rep.Probes.MaxStartDelayMs)
	var out bytes.Buffer
	Print(&out, rep)
	require.Contains(t, out.String(), "0/0 admitted, start delays none measured")
	require.NotContains(t, out.String(), "max 0s")
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	require.NotContains(t, string(b), "max_start_delay_ms")
	require.Contains(t, string(b), `"start_delays_ms":[]`)

	rep, err = Run(defaults())
	require.NoError(t, err)
	require.NotNil(t, rep.Probes.MaxStartDelayMs, "measured when probes ran")
}

package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProbesWithNoHeavyTaskSayIdle: with no heavy task offered the probes run
// while heavy is idle, and the report says so. Review r13 found "control
// probes while heavy busy (0 running of 6, 0 queued)": busy with nothing
// running.
func TestProbesWithNoHeavyTaskSayIdle(t *testing.T) {
	cfg := defaults()
	cfg.HeavyOffered = 0
	rep, err := Run(cfg)
	require.NoError(t, err)
	require.Zero(t, rep.Probes.HeavyRunning)
	var out bytes.Buffer
	Print(&out, rep)
	require.Contains(t, out.String(), "control probes while heavy idle (0 running of 6, 0 queued)")
}

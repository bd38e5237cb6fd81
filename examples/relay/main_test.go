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

// defaults is the program's flag defaults.
func defaults() config {
	return config{Tries: 3, CallsPerTry: 2, Allowance: 4, AttemptTimeout: 10 * time.Second, Backoff: time.Millisecond}
}

func TestSeed000Relay(t *testing.T) {
	res, err := run(t.Context(), defaults())
	require.NoError(t, err)
	require.Equal(t, int64(3), res.NaiveFrontendCalls)
	require.Equal(t, int64(6), res.NaiveDependencyCalls, "independent caps multiply: 3 × 2")
	require.Equal(t, int64(4), res.TollgateDependencyCalls, "one shared allowance: 4 units")
	require.Equal(t, int64(2), res.TollgateFrontendCalls, "the third origin try is refused locally")
	require.Equal(t, "NOT_ADMITTED", res.TollgateOutcome)
	require.Equal(t, "ALLOWANCE_EXHAUSTED", res.TollgateReason)
	require.True(t, res.TollgateFinal)
	require.Equal(t, int64(1), res.TollgateRefusedAllowance)
	ids := res.TollgateAttemptIDs
	require.NotEmpty(t, ids["origin"])
	require.Equal(t, ids["origin"], ids["frontend"])
	require.Equal(t, ids["origin"], ids["dependency"])

	var out bytes.Buffer
	report(&out, res)
	require.Contains(t, out.String(), "the dependency 6")
	require.Contains(t, out.String(), "the dependency 4")
	// A review found the attempt timeout and backoff hard-coded and not
	// said, and the header claiming NOT_ADMITTED for the plain run too.
	require.Contains(t, out.String(), "(plain gRPC: RESOURCE_EXHAUSTED; tollgate: NOT_ADMITTED QUEUE_FULL)")
	require.Contains(t, out.String(), "configured: origin tries=3, frontend calls per try=2, allowance=4 units, attempt timeout=10s, backoff=1ms")
	js, err := json.Marshal(res)
	require.NoError(t, err)
	require.Contains(t, string(js), `"attempt_timeout":"10s"`)
	require.Contains(t, string(js), `"backoff":"1ms"`)
}

// TestNoAllowanceNamesTheSilentDependency: with no units below the origin
// no call reaches the dependency, and the report says so instead of ending
// in "dependency=" with nothing after it, as a review found it did.
func TestNoAllowanceNamesTheSilentDependency(t *testing.T) {
	cfg := defaults()
	cfg.Allowance = 0
	res, err := run(t.Context(), cfg)
	require.NoError(t, err)
	require.Zero(t, res.TollgateDependencyCalls)
	require.Equal(t, "ALLOWANCE_EXHAUSTED", res.TollgateReason)
	var out bytes.Buffer
	report(&out, res)
	require.Contains(t, out.String(), "dependency=(none: it received no call)")
}

func TestRelayFlagsChangeTheCounts(t *testing.T) {
	cfg := defaults()
	cfg.Tries, cfg.CallsPerTry, cfg.Allowance = 2, 3, 10
	res, err := run(t.Context(), cfg)
	require.NoError(t, err)
	require.Equal(t, int64(6), res.NaiveDependencyCalls)
	require.Equal(t, int64(6), res.TollgateDependencyCalls, "an allowance above 2×3 does not bind")
	require.Equal(t, "QUEUE_FULL", res.TollgateReason)

	cfg = defaults()
	cfg.Tries = 0
	_, err = run(t.Context(), cfg)
	require.Error(t, err)
	cfg = defaults()
	cfg.Backoff = 0
	_, err = run(t.Context(), cfg)
	require.Error(t, err)
}

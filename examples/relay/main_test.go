package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSeed000Relay(t *testing.T) {
	res, err := run(t.Context(), config{Tries: 3, CallsPerTry: 2, Allowance: 4})
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
}

func TestRelayFlagsChangeTheCounts(t *testing.T) {
	res, err := run(t.Context(), config{Tries: 2, CallsPerTry: 3, Allowance: 10})
	require.NoError(t, err)
	require.Equal(t, int64(6), res.NaiveDependencyCalls)
	require.Equal(t, int64(6), res.TollgateDependencyCalls, "an allowance above 2×3 does not bind")
	require.Equal(t, "QUEUE_FULL", res.TollgateReason)

	_, err = run(t.Context(), config{Tries: 0, CallsPerTry: 1})
	require.Error(t, err)
}

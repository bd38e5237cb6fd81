package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// With -allowance 1, a scenario whose fault needs a second call below the
// origin cannot inject it: the call is refused ALLOWANCE_EXHAUSTED before it
// is sent. The verdict says so, naming the refusal, instead of pointing only
// at -attempt-timeout and -per-try (a fresh-eyes review followed that hint
// the wrong way). And -redis "" skips the Redis scenario, saying why,
// instead of letting go-redis fall back to localhost:6379.
func TestVerdictNamesTheRefusalThatKeptTheFaultAway(t *testing.T) {
	cfg := testConfig()
	cfg.Allowance = 1
	cfg.RedisAddr = ""
	res, err := run(t.Context(), cfg)
	require.NoError(t, err)
	require.Contains(t, res.FaultsMissed, "unknown-second-call")
	require.Contains(t, res.Skipped, "restart-redis")
	for _, s := range res.Scenarios {
		if s.Name == "restart-redis" {
			require.True(t, s.Skipped)
			require.Contains(t, s.SkipReason, `-redis ""`)
		}
	}
	code, why := verdict(res)
	require.Equal(t, 1, code)
	require.Contains(t, why, "unknown-second-call")
	require.Contains(t, why, "ALLOWANCE_EXHAUSTED")
	require.Contains(t, why, "-allowance")
}

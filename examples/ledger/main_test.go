package main

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testConfig is the program's default configuration: tens of milliseconds
// per try. No assertion below depends on how long anything took.
func testConfig() config { return defaultConfig() }

// allowedVerdicts are the endings DESIGN.md §3 permits for an intended
// effect: run exactly once and answered, reported UNKNOWN or COMMITTED with
// its attempt ID (run at most once), or a definite "no" with no effect.
var allowedVerdicts = map[string]bool{
	"exactly-once": true, "reported-unknown": true, "reported-committed": true, "not-run": true,
}

// requireRedis skips (or, with TOLLGATE_REQUIRE_REDIS=1, fails) a test of a
// Redis scenario the program had to skip.
func requireRedis(t *testing.T, s scenarioResult) {
	t.Helper()
	if !s.Skipped {
		return
	}
	if os.Getenv("TOLLGATE_REQUIRE_REDIS") == "1" {
		t.Fatalf("%s skipped with TOLLGATE_REQUIRE_REDIS=1: %s", s.Name, s.SkipReason)
	}
	t.Skipf("%s: %s (run scripts/ensure-redis.sh, or set TOLLGATE_REDIS_ADDR)", s.Name, s.SkipReason)
}

// TestLedgerFaultMatrix runs the five faults once and checks, for each, the
// invariants (no effect twice, none silently lost, every UNKNOWN named) and
// the way each call ended.
func TestLedgerFaultMatrix(t *testing.T) {
	res, err := run(t.Context(), testConfig())
	require.NoError(t, err)
	require.Len(t, res.Scenarios, 5)
	byName := map[string]scenarioResult{}
	for _, s := range res.Scenarios {
		byName[s.Name] = s
	}

	t.Run("invariants", func(t *testing.T) {
		require.Zero(t, res.Duplicates, "no effect ran twice")
		require.Zero(t, res.Lost, "no effect was silently lost")
		require.Empty(t, res.FaultsMissed, "every scenario's fault happened")
		code, _ := verdict(res)
		require.Zero(t, code)
		for _, s := range res.Scenarios {
			if s.Skipped {
				continue
			}
			require.True(t, s.FaultInjected, s.Name)
			require.NotEmpty(t, s.Fault, s.Name)
			require.Zero(t, s.Duplicates, s.Name)
			require.Zero(t, s.Lost, s.Name)
			require.Equal(t, s.IntendedEffects, len(s.Calls), s.Name)
			for _, c := range s.Calls {
				require.Truef(t, allowedVerdicts[c.Verdict], "%s %s: %+v", s.Name, c.Account, c)
				require.LessOrEqual(t, c.Effects, 1, "%s %s", s.Name, c.Account)
				require.NotEmpty(t, c.AttemptID)
				if c.Outcome == "UNKNOWN" || c.Outcome == "COMMITTED" {
					require.Equal(t, c.AttemptID, c.ReportedAttemptID, "%s %s: an UNKNOWN answer names its attempt", s.Name, c.Account)
				}
			}
			require.LessOrEqual(t, s.ExecutedEffects, s.IntendedEffects, s.Name)
		}
	})

	t.Run("dropped-response", func(t *testing.T) {
		s := byName["dropped-response"]
		require.Equal(t, 1, s.IntendedEffects)
		require.Equal(t, 1, s.ExecutedEffects)
		c := s.Calls[0]
		require.Equal(t, "OK", c.Outcome, "%+v", c)
		require.Equal(t, "exactly-once", c.Verdict)
		require.Equal(t, testConfig().Amount, c.Total, "the stored response of the one run")
		require.GreaterOrEqual(t, s.Queries, int64(1), "resolved by FenceAttempt, not by repeating")
		require.Zero(t, s.UnknownReported)
		require.Equal(t, s.Units.Total, s.Units.Free, "a resolved call keeps every unit")
	})

	t.Run("timeout-after-commit", func(t *testing.T) {
		s := byName["timeout-after-commit"]
		require.Equal(t, 1, s.ExecutedEffects)
		c := s.Calls[0]
		require.Equal(t, "OK", c.Outcome, "%+v", c)
		require.Equal(t, "exactly-once", c.Verdict)
		require.Equal(t, testConfig().Amount, c.Total)
		require.GreaterOrEqual(t, s.Queries, int64(1), "the handler answers only after the owner's query arrived")
	})

	restarted := func(t *testing.T, s scenarioResult) {
		t.Helper()
		require.Equal(t, 1, s.Restarts, "the server was replaced between the effect and the answer")
		require.Equal(t, 1, s.ExecutedEffects, "the effect ran before the restart, and never again")
		c := s.Calls[0]
		require.Equal(t, "UNKNOWN", c.Outcome, "%+v", c)
		require.Equal(t, "reported-unknown", c.Verdict)
		require.Equal(t, c.AttemptID, c.ReportedAttemptID)
		require.Equal(t, []string{"0"}, c.Calls)
		require.Equal(t, 1, s.UnknownReported)
		require.GreaterOrEqual(t, s.Queries, int64(1))
		require.Equal(t, s.Units.Total, s.UnitsLeft, "no unit is known to be spent")
	}
	// Which query answered depends on whether the restart beat the try's
	// timeout (it does unless the machine stalls for restart-per-try):
	// either way the call ends UNKNOWN, and what the replacement's store
	// holds is checked directly.
	t.Run("restart-memory", func(t *testing.T) {
		s := byName["restart-memory"]
		restarted(t, s)
		require.Equal(t, "UNKNOWN", s.ReplacementRecord, "the new memory store cannot vouch for an attempt minted before it")
		t.Logf("resolution: %s", s.Calls[0].Why)
	})
	t.Run("restart-redis", func(t *testing.T) {
		s := byName["restart-redis"]
		requireRedis(t, s)
		restarted(t, s)
		require.Contains(t, []string{"IN_PROGRESS", "ABANDONED"}, s.ReplacementRecord,
			"the record survived the restart (ABANDONED once its lease ran out)")
		t.Logf("resolution: %s", s.Calls[0].Why)
	})

	t.Run("unknown-second-call", func(t *testing.T) {
		s := byName["unknown-second-call"]
		require.Equal(t, 2, s.IntendedEffects)
		require.Equal(t, 2, s.ExecutedEffects)
		require.Equal(t, "exactly-once", s.Calls[0].Verdict, "%+v", s.Calls[0])
		second := s.Calls[1]
		require.Equal(t, "UNKNOWN", second.Outcome, "%+v", second)
		require.Equal(t, "reported-unknown", second.Verdict)
		require.Contains(t, second.Why, "could not be queried")
		require.NotNil(t, s.Origin)
		require.Equal(t, "UNKNOWN", s.Origin.Outcome, "%+v", s.Origin)
		require.Equal(t, s.Origin.AttemptID, s.Origin.ReportedAttemptID)
		require.Equal(t, s.Origin.AttemptID, second.AttemptID, "one attempt across both tiers")
		// Seed 000: two downstream calls spent two of the four units; the
		// attempt stops with two still available.
		require.Equal(t, units{Total: 4, Free: 2, Held: 0, Spent: 2}, s.Units)
		require.Equal(t, int64(2), s.UnitsLeft)
	})

	t.Run("totals", func(t *testing.T) {
		var intended, executed, unknown int
		var queries, left int64
		for _, s := range res.Scenarios {
			if s.Skipped {
				require.Contains(t, res.Skipped, s.Name)
				continue
			}
			intended += s.IntendedEffects
			executed += s.ExecutedEffects
			unknown += s.UnknownReported
			queries += s.Queries
			left += s.UnitsLeft
		}
		require.Equal(t, intended, res.IntendedEffects)
		require.Equal(t, executed, res.ExecutedEffects)
		require.Equal(t, unknown, res.UnknownReported)
		require.Equal(t, queries, res.Queries)
		require.Equal(t, left, res.UnitsLeft)
		require.Equal(t, res.IntendedEffects, res.ExecutedEffects, "every fault struck after the commit")
	})

	t.Run("report", func(t *testing.T) {
		var out bytes.Buffer
		report(&out, res)
		require.Contains(t, out.String(), "duplicates=0 lost=0")
		require.Contains(t, out.String(), "free=2 held=0 spent=2")
		b, err := json.Marshal(res)
		require.NoError(t, err)
		var fields map[string]any
		require.NoError(t, json.Unmarshal(b, &fields))
		for _, k := range []string{"intended_effects", "executed_effects", "duplicates", "unknown_reported", "queries", "units_left", "scenarios"} {
			require.Contains(t, fields, k)
		}
	})
}

// TestLedgerFlagsChangeTheRun: the numbers follow the configuration — with
// one try per call and a larger allowance the invariants still hold and the
// seed scenario keeps the units its two calls did not spend.
func TestLedgerFlagsChangeTheRun(t *testing.T) {
	cfg := testConfig()
	cfg.Tries = 1
	cfg.Allowance = 6
	cfg.Skew = 5 * time.Millisecond
	cfg.Amount = 7
	res, err := run(t.Context(), cfg)
	require.NoError(t, err)
	require.Zero(t, res.Duplicates)
	require.Zero(t, res.Lost)
	require.Empty(t, res.FaultsMissed)
	for _, s := range res.Scenarios {
		for _, c := range s.Calls {
			require.Truef(t, allowedVerdicts[c.Verdict], "%s %s: %+v", s.Name, c.Account, c)
			if c.Outcome == "OK" {
				require.Equal(t, int64(7), c.Total)
			}
		}
		if s.Name == "unknown-second-call" {
			// With one try the frontend keeps no unit for repeats: each
			// downstream call takes one and lends it all the rest. The
			// first grant comes back; the second (4 units) is held when
			// its outcome stays unknown, and the frontend's sealed ledger
			// counts it as spent (DESIGN.md §3.3): 2 + 4 spent, none left.
			// With three tries (the matrix above) the frontend kept 2
			// units for repeats, lent nothing, and 2 were left.
			require.Equal(t, units{Total: 6, Free: 0, Held: 0, Spent: 6}, s.Units)
			require.Zero(t, s.UnitsLeft)
		}
	}

	_, err = run(t.Context(), config{Tries: 0})
	require.Error(t, err)
}

// TestLedgerFirstCallRefusedIsNotAdmitted: with no units, the frontend's
// first call to the ledger is refused locally before anything took effect;
// the frontend says so, and the origin learns NOT_ADMITTED, not UNKNOWN. A
// review found it reported UNKNOWN for a request that changed nothing.
func TestLedgerFirstCallRefusedIsNotAdmitted(t *testing.T) {
	cfg := testConfig()
	cfg.Allowance = 0
	res, err := run(t.Context(), cfg)
	require.NoError(t, err)
	const name = "unknown-second-call"
	var found bool
	for _, s := range res.Scenarios {
		if s.Name != name {
			continue
		}
		found = true
		require.NotEmpty(t, s.Calls)
		for _, c := range s.Calls { // one per run of the frontend: the origin repeats a refusal
			require.Equal(t, name+"-1", c.Account, "the frontend stops at its first call's refusal")
			require.Equal(t, "ALLOWANCE_EXHAUSTED", c.Reason)
			require.Equal(t, "not-run", c.Verdict)
		}
		require.Equal(t, "NOT_ADMITTED", s.Origin.Outcome, "%+v", s.Origin)
		require.Equal(t, 2, s.IntendedEffects, "the plan's two changes, though the frontend asked for only the first")
		require.Zero(t, s.ExecutedEffects)
		require.False(t, s.FaultInjected, "no second call was made, so its answer was never lost")
	}
	require.True(t, found)
	require.Contains(t, res.FaultsMissed, name)
	code, why := verdict(res)
	require.Equal(t, 1, code)
	require.Contains(t, why, name)
}

// TestLedgerFaultThatDidNotHappenFails: with an attempt deadline too short
// for any try, every call is refused DEADLINE_UNREACHABLE before a handler
// runs, so no fault strikes (the restart scenarios restart nothing). A
// review found the program printing its totals and exiting 0 all the same,
// and the frontend scenario's intended effects counted from the calls its
// frontend made (none) instead of from its plan (two).
func TestLedgerFaultThatDidNotHappenFails(t *testing.T) {
	cfg := testConfig()
	// Just over what DialOptions accepts (a hop margin and minimum try time
	// that leave no time in the attempt are refused when the options are
	// built): a try fits only if sent within a nanosecond of its attempt's
	// start.
	cfg.AttemptTimeout = interceptor.DefaultHopMargin + interceptor.DefaultMinTryTime + time.Nanosecond
	res, err := run(t.Context(), cfg)
	require.NoError(t, err)
	for _, s := range res.Scenarios {
		if s.Skipped {
			continue
		}
		require.False(t, s.FaultInjected, s.Name)
		require.Contains(t, res.FaultsMissed, s.Name)
		require.Zero(t, s.Restarts, s.Name)
		require.Zero(t, s.ExecutedEffects, s.Name)
		if s.Name == "unknown-second-call" {
			require.Equal(t, 2, s.IntendedEffects, "intended comes from the plan")
		} else {
			require.Equal(t, 1, s.IntendedEffects, s.Name)
		}
	}
	code, why := verdict(res)
	require.Equal(t, 1, code, "a run whose faults did not happen must not exit 0")
	require.Contains(t, why, "restart-memory")
	var out bytes.Buffer
	report(&out, res)
	require.Contains(t, out.String(), "→ DID NOT HAPPEN")
	require.Contains(t, out.String(), "faults-missed=")
}

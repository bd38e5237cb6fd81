package idempotency_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// A review found that Reset, which drops every record and moves the horizon
// to the latest reading "as a restart would", let an attempt created a skew
// ahead of that reading through: a try begun in the same millisecond as the
// Reset, of an attempt whose ID time is the reading plus the skew (a caller
// whose clock leads by the skew), has ts − skew ≥ horizon, so once its
// record was dropped its absence was evidence again — Get answered UNSEEN, a
// fence laid a tombstone, and try 2 began: the handler ran twice for one
// record key (DESIGN §3.7, §3.8). The Redis store moves its horizon from the
// next millisecond of its own clock for this reason. Reset now notes the
// dropped records' attempts as swept (see sweep), as losing them is.
func TestMemoryResetInTheMillisecondOfABeginKeepsItsTryFromRunningAgain(t *testing.T) {
	for _, op := range []string{"get", "fence", "begin"} {
		t.Run(op, func(t *testing.T) {
			clock, p, s := clockedMemory(t)
			clock.Advance(p.Skew)
			k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
			beginSucceeded(t, s, clock, k, false, "charged")
			s.Reset() // the same millisecond: the virtual clock has not moved
			clock.Advance(time.Second)

			requireNoEvidence(t, s, clock, k, op)

			// An attempt created after the Reset's is vouched for as before.
			res := beginNow(t, s, clock, keyNow(clock, "0"), false)
			require.True(t, res.Started, "a new attempt after the Reset was refused %v", res.Refusal)
		})
	}
}

// A review found that the memory store, since it answers an attempt older
// than the TTL less the skew with no VerifiableFrom (an ordinary expiry),
// answers so too while records of attempts created after it, and after now,
// were swept by a clock stepped forward and since corrected: a new attempt
// created now is refused for that sweep, from VerifiableFrom on, yet the old
// one's refusal says nothing of it (no retry-after on a first try, the
// message of an attempt too old), so its caller's next attempt is refused
// too, at once. VerifiableFrom is now the sweep's whenever a clock step
// swept a record (one of an attempt too recent to have expired by the
// latest reading), the old attempt's own age notwithstanding.
func TestMemoryOldAttemptAfterStepSweepSaysWhenANewOnePasses(t *testing.T) {
	clock, p, s := clockedMemory(t)
	clock.Advance(p.Skew)
	start := clock.Now()
	old := keyNow(clock, "0")
	beginSucceeded(t, s, clock, old, false, "charged")

	// The wall clock steps a minute forward; the server mints and runs an
	// attempt there, and stays stepped past its expiry, sweeping it.
	step := time.Minute
	clock.Advance(step)
	beginSucceeded(t, s, clock, keyNow(clock, "0"), true, "charged")
	clock.Advance(p.TTL + time.Second)
	probeNow(t, s, clock)
	// Corrected: real time, the old attempt now past the TTL less the skew.
	clock.Advance(-step)
	require.Greater(t, clock.Now().Sub(start), p.TTL-p.Skew)

	fresh := beginNow(t, s, clock, keyNow(clock, "0"), false)
	require.Equal(t, idempotency.RefusedUnverifiable, fresh.Refusal)
	require.False(t, fresh.VerifiableFrom.IsZero(), "a new attempt refused for the step's sweep")

	k := old
	k.Call = "1"
	res := beginNow(t, s, clock, k, false)
	require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal)
	require.True(t, fresh.VerifiableFrom.Equal(res.VerifiableFrom),
		"the old attempt's VerifiableFrom %v, while a new attempt passes only from %v", res.VerifiableFrom, fresh.VerifiableFrom)
}

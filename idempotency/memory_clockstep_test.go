package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that the memory store swept, by a reading from a clock
// stepped forward further than the TTL, the record of a call that had just
// SUCCEEDED; once the clock was corrected (nowLocked forgets a reading that
// far ahead, so that it does not keep the store from vouching until real
// time catches up), the record's absence was evidence again: Get answered
// UNSEEN, a fence laid a tombstone, and try 2 of the call began — the
// handler ran twice for one record key (DESIGN §3.7, §3.8). nowLocked's doc
// said so ("a record swept by a reading stepped further ahead may be vouched
// absent once the clock is corrected"). The store now never vouches for an
// attempt created no later than the newest attempt whose record it swept.
func TestMemoryClockStepForwardSweepsRecordVouchedAbsentAfterCorrection(t *testing.T) {
	for _, op := range []string{"get", "fence", "begin"} {
		t.Run(op, func(t *testing.T) {
			clock, p, s := clockedMemory(t)
			clock.Advance(p.Skew)
			k := keyNow(clock, "0")
			beginSucceeded(t, s, clock, k, false, "charged")

			// The wall clock steps forward past the record's expiry; one
			// call reads it (and sweeps); NTP steps it back a second later.
			step := p.TTL + 5*time.Second
			clock.Advance(step)
			probeNow(t, s, clock)
			clock.Advance(-step + time.Second)

			requireNoEvidence(t, s, clock, k, op)

			// Attempts created after the swept one are vouched for as before.
			clock.Advance(time.Millisecond)
			res := beginNow(t, s, clock, keyNow(clock, "0"), false)
			require.True(t, res.Started, "a new attempt after the correction was refused %v", res.Refusal)
		})
	}
}

// requireNoEvidence requires that op ("get", "fence" or "begin") on k, a
// call whose try 1 SUCCEEDED and whose record the store no longer holds,
// takes that absence for no evidence: Get reads UNKNOWN (not UNSEEN), a
// fence lays no tombstone (UNKNOWN), and try 2 is refused unverifiable.
func requireNoEvidence(t *testing.T, s *idempotency.MemoryStore, clock *storetest.Clock, k idempotency.Key, op string) {
	t.Helper()
	ctx := context.Background()
	switch op {
	case "get":
		rec, err := s.Get(ctx, k)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(),
			"a call that SUCCEEDED reads %v", rec.GetState())
	case "fence":
		rec, err := s.Fence(ctx, k, 1)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(),
			"a fence over a call that SUCCEEDED answered %v", rec.GetState())
	case "begin":
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(5 * time.Second)})
		require.NoError(t, err)
		require.False(t, res.Started, "try 2 of a call whose try 1 SUCCEEDED started")
		require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal)
	default:
		t.Fatalf("unknown op %q", op)
	}
}

// clockedMemory is a memory store with storetest's policy, p, on a
// virtual clock started now.
func clockedMemory(t *testing.T) (*storetest.Clock, idempotency.Policy, *idempotency.MemoryStore) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	return clock, p, newMemory(t, clock, p)
}

// keyNow is the key of call "call" of tenant acme's attempt created at the
// clock's now, on method /x.Y/Z.
func keyNow(clock *storetest.Clock, call string) idempotency.Key {
	return idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: call, Method: "/x.Y/Z"}
}

// beginNow begins try 1 of k (minted by the server, or not) with 5 s left,
// requiring no error.
func beginNow(t *testing.T, s *idempotency.MemoryStore, clock *storetest.Clock, k idempotency.Key, minted bool) idempotency.BeginResult {
	t.Helper()
	res, err := s.Begin(context.Background(), idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(5 * time.Second), Minted: minted})
	require.NoError(t, err)
	return res
}

// beginSucceeded begins try 1 of k, requires it started, and records it
// SUCCEEDED with response resp.
func beginSucceeded(t *testing.T, s *idempotency.MemoryStore, clock *storetest.Clock, k idempotency.Key, minted bool, resp string) {
	t.Helper()
	res := beginNow(t, s, clock, k, minted)
	require.True(t, res.Started, "%v", res.Refusal)
	require.NoError(t, s.Finish(context.Background(), idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte(resp)}))
}

// probeNow reads (Get) a probe call of an attempt created at the clock's
// now: the reading sweeps the records it finds expired.
func probeNow(t *testing.T, s *idempotency.MemoryStore, clock *storetest.Clock) {
	t.Helper()
	_, err := s.Get(context.Background(), keyNow(clock, "probe"))
	require.NoError(t, err)
}

package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// The memory store's nowLocked (commit a1c4f6b) keeps a high-water mark of
// its clock readings, so that a wall clock stepping back cannot vouch for a
// swept record's absence. But a single reading from a clock stepped forward
// (a bad NTP step, a VM resumed with a wrong RTC) that is corrected a moment
// later now stays the store's "now" until real time catches up: every try's
// deadline reads as passed, and every new try is refused DEADLINE_EXPIRED
// for the whole size of the step. Before the commit only the calls made
// during the step were affected.
func TestRegression14cStoreMemoryClockStepForwardPoisonsStore(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	s := newMemory(t, clock, p)
	ctx := context.Background()
	clock.Advance(p.Skew)

	begin := func(call string) idempotency.BeginResult {
		t.Helper()
		k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: call, Method: "/x.Y/Z"}
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(5 * time.Second)})
		require.NoError(t, err)
		return res
	}
	require.True(t, begin("before").Started)

	// The wall clock steps an hour forward; one call reads it; NTP steps it back.
	clock.Advance(time.Hour)
	_, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "probe", Method: "/x.Y/Z"})
	require.NoError(t, err)
	clock.Advance(-time.Hour + time.Second)

	res := begin("after")
	assert.True(t, res.Started,
		"a new try with 5 s left, one second after the clock was corrected, was refused %v: the store still judges by the stepped-forward reading", res.Refusal)

	// Reset, documented to move the horizon "to now, as a restart would",
	// does not recover either.
	s.Reset()
	clock.Advance(p.Skew)
	res = begin("after-reset")
	require.True(t, res.Started, "after Reset, a new try was refused %v", res.Refusal)
}

// The same with a step smaller than the TTL: a forward step of 8 s read by
// one Get and corrected at once leaves the store judging leases by the
// stepped reading, so the handler of a try begun just before, with 5 s
// left, cannot record its success: its Finish is refused and the record
// reads ABANDONED (the owner ends the call UNKNOWN).
func TestRegression14cStoreMemoryClockStepForwardAbandonsRunningTry(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	s := newMemory(t, clock, p)
	ctx := context.Background()
	clock.Advance(p.Skew)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(5 * time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)

	clock.Advance(8 * time.Second) // a bad step forward, read by one call
	_, err = s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "probe", Method: "/x.Y/Z"})
	require.NoError(t, err)
	clock.Advance(-8*time.Second + 100*time.Millisecond) // corrected; 4.9 s of the try's deadline left

	err = s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")})
	require.NoError(t, err, "the try's handler finished 4.9 s before its deadline, but its success cannot be recorded")
}

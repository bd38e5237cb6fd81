package idempotency_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that MemoryStore.Begin read the clock before it took the store's mutex, and
// sweeps and judges absence with that reading. A goroutine that read the
// clock just before a record's expiry and then waited (preempted, or
// queued on the mutex) while another call, reading the clock just after,
// swept the record, finds it gone and — its now still earlier than
// ts − skew + TTL — vouches for the absence: the try of a call that
// already SUCCEEDED started again. The clock hook below stands for a delay
// right after the clock is read: before the lock was taken then, under it
// now. The clock is read under the lock, in every method.
func TestRegression14MemoryStaleNowResurrectsSweptRecord(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	var armed atomic.Bool
	readNow, proceed := make(chan struct{}), make(chan struct{})
	now := func() time.Time {
		n := clock.Now()
		if armed.CompareAndSwap(true, false) {
			readNow <- struct{}{}
			<-proceed
		}
		return n
	}
	s, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p),
		hooks.MemoryClock(now).(idempotency.MemoryOption))
	require.NoError(t, err)
	ctx := context.Background()
	clock.Advance(p.Skew)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	long := clock.Now().Add(p.TTL + time.Minute) // an attempt that outlives the TTL (its tries capped per arrival)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(p.MaxAttemptDeadline)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))

	// The record lives TTL after its finish (ts + TTL); absence is evidence
	// until ts - skew + TTL.
	clock.Advance(p.TTL - p.Skew - time.Millisecond)
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())

	armed.Store(true)
	done := make(chan idempotency.BeginResult, 1)
	go func() {
		r, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: long})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	<-readNow // try 2's Begin read the clock: 1 ms before it stops vouching for an absence
	clock.Advance(p.Skew + time.Millisecond)
	// Another call, skew + 1 ms later, sweeps the expired record — at once
	// when Begin holds no lock while it waits; after Begin when it does.
	got := make(chan *tollgatev1.AttemptRecord, 1)
	go func() {
		rec, err := s.Get(ctx, k)
		if err != nil {
			t.Error(err)
		}
		got <- rec
	}()
	var swept *tollgatev1.AttemptRecord
	select {
	case swept = <-got:
	case <-time.After(200 * time.Millisecond): // waiting for the lock Begin holds
	}
	close(proceed)
	r := <-done
	if swept == nil {
		swept = <-got
	}
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, swept.GetState(), "expired: absence is no evidence")
	require.False(t, r.Started, "try 2 of a call whose try 1 SUCCEEDED started: a now read before the lock vouched for a record swept meanwhile (refusal %v)", r.Refusal)
}

package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that commit 456d181 reads the memory store's clock under its lock so
// that "readings follow the order calls act in". They do only while the
// clock never goes back: the store reads time.Now().UnixMilli(), the wall
// clock, which an NTP step (or a VM resumed on another host) moves back. A
// call that swept a record at now1 and a later call reading now1 - 1 ms,
// well within the policy's skew, vouches for the absence of the record the
// first swept: the try of a call that SUCCEEDED starts again. The attempt
// here was minted by a client whose clock is the skew ahead (ts = now +
// skew), and its try finished at once, so absence is evidence until the
// very millisecond the record expires. (The Redis store keeps its records
// DefaultKeep past their expiry, which covers such a step.)
func TestRegression14bRecordsMemoryClockStepBackResurrectsSweptRecord(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	s, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p),
		hooks.MemoryClock(clock.Now).(idempotency.MemoryOption))
	require.NoError(t, err)
	ctx := context.Background()
	clock.Advance(p.Skew)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))

	clock.Advance(p.TTL) // the record's expiry: a Get sweeps it
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())

	clock.Advance(-time.Millisecond) // the wall clock steps back 1 ms (less than the skew)
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 2 of a call whose try 1 SUCCEEDED started: a reading 1 ms earlier than the sweep's vouched for the swept record's absence")
}

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

// A review found that, while the memory store assumes its clock goes forward "give or take the skew
// plus the grace" (nowLocked). Within that assumption, the clock steps back
// 1 s (skew 500 ms + grace 1 s = 1.5 s) after a try of attempt X SUCCEEDED.
// Reset then drops every record, X's included, but moves the horizon to the
// current (stepped-back) reading rather than to the latest reading the store
// acted on (169ee67): X, whose record was written at that later reading, now
// lies inside the horizon, reads UNSEEN, is fenced, and its try 2 starts —
// the call that SUCCEEDED runs again. Before 169ee67 Reset used the latest
// reading and X read UNKNOWN.
func TestRegression14dRecordsMemoryResetAfterSmallStepBackVouchesDroppedRecord(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy() // skew 500 ms, grace 1 s
	s := newMemory(t, clock, p)
	ctx := context.Background()
	clock.Advance(2 * time.Second)

	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))

	clock.Advance(-time.Second) // a step back well within skew + grace
	s.Reset()                   // the records are lost, as in a restart
	clock.Advance(600 * time.Millisecond)

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(),
		"the attempt whose SUCCEEDED record Reset dropped must not read UNSEEN")
	_, err = s.Fence(ctx, k, 1)
	require.NoError(t, err)
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started, "try 2 of a call whose try 1 SUCCEEDED started after Reset")
}

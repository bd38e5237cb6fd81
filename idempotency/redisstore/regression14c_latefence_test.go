package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// A review found that a Fence that waited for a pooled connection (no Redis stall) longer than
// the keep runs its script with its stale reading: the SUCCEEDED record is
// gone from Redis, the stale now vouches for its absence, and the script
// writes a tombstone FENCED(1). Fence then fails STORE_UNAVAILABLE ("instead
// of acting on its judgement", DefaultKeep's doc) but the tombstone stays,
// live for a TTL from the stale reading: try 2 of the call that SUCCEEDED
// begins. Begin's same case was fixed (the begun try is ended UNKNOWN);
// Fence's was not. Real clock; the keep shortened to 300 ms.
func TestRegression14cStoreLateFenceTombstoneLetsSucceededCallRunAgain(t *testing.T) {
	_, prefix := newClient(t)
	c := onePoolClient(t, nil)
	plain, _ := newClient(t)
	p := latePolicy
	clk := newArmedClock(0)
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), hooks.RedisClock(clk.now).(redisstore.Option),
		hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	ctx := context.Background()
	k, ts := succeededCall(t, s, clk.now, p.Skew)
	// The owner's FenceAttempt(1) reads the clock shortly before absence
	// stops being evidence, then waits for the only pooled connection.
	require.ErrorIs(t, lateFence(t, s, c, plain, prefix, clk, p, k, ts), idempotency.ErrStoreUnavailable, "the late Fence is refused")

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	t.Logf("after the late Fence the key reads %v (fenced through %d)", rec.GetState(), rec.GetFencedThroughTry())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 2 of a call whose try 1 SUCCEEDED started: the late Fence's tombstone, written on an absence its stale reading vouched for, stayed")
}

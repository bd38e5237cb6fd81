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

// A review found that checkClock said "A Redis clock behind costs nothing" and New accepted a
// Redis whose clock lags the servers' by any amount. But the Begin and Fence
// scripts' staleness check (Redis TIME - reading > keep - skew) is weakened
// by exactly that lag: TestRegression14cStoreLateFenceTombstoneLetsSucceededCallRunAgain's
// scenario, with the server's clock 10 s ahead of Redis's (skew 100 ms, the
// keep shortened to 300 ms), writes its tombstone again, and try 2 of a
// call that SUCCEEDED begins.
//
// A final review found the same with a lag New accepts (the skew plus up to
// a second): the scripts' threshold and the keep now allow for it.
func TestRegression14eRedisClockBehindDisablesStaleCheck(t *testing.T) {
	for _, ahead := range []time.Duration{10 * time.Second, time.Second} { // the servers' clock; Redis's lags it
		t.Run(ahead.String(), func(t *testing.T) { redisBehind(t, ahead) })
	}
}

func redisBehind(t *testing.T, ahead time.Duration) {
	_, prefix := newClient(t)
	c := onePoolClient(t, nil)
	plain, _ := newClient(t)
	p := latePolicy
	clk := newArmedClock(ahead)
	s, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p),
		hooks.RedisClock(clk.now).(redisstore.Option), hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	if err != nil {
		t.Logf("New refused the lagging Redis: %v", err)
		return // refusing it is a fine answer
	}
	ctx := context.Background()
	k, ts := succeededCall(t, s, clk.now, p.Skew)
	// The owner's FenceAttempt(1) reads the clock shortly before absence
	// stops being evidence, then waits for the only pooled connection.
	t.Logf("the late Fence answered %v", lateFence(t, s, c, plain, prefix, clk, p, k, ts))

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	t.Logf("after the late Fence the key reads %v (fenced through %d)", rec.GetState(), rec.GetFencedThroughTry())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clk.now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 2 of a call whose try 1 SUCCEEDED started: a Redis clock behind the server's disabled the Fence script's staleness check")
}

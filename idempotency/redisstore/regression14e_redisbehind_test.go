package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that checkClock said "A Redis clock behind costs nothing" and New accepted a
// Redis whose clock lags the servers' by any amount. But the Begin and Fence
// scripts' staleness check (Redis TIME - reading > keep - skew) is weakened
// by exactly that lag: TestRegression14cStoreLateFenceTombstoneLetsSucceededCallRunAgain's
// scenario, with the server's clock 10 s ahead of Redis's (skew 100 ms, the
// keep shortened to 300 ms), writes its tombstone again, and try 2 of a
// call that SUCCEEDED begins.
func TestRegression14eRedisClockBehindDisablesStaleCheck(t *testing.T) {
	_, prefix := newClient(t)
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, PoolSize: 1, PoolTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	plain, _ := newClient(t)
	p := idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
		MaxAttemptDeadline: 3 * time.Second, TTL: 3200 * time.Millisecond, MaxResponseBytes: 1024}
	const ahead = 10 * time.Second // the servers' clock; Redis's lags it
	var armed atomic.Bool
	readNow := make(chan struct{}, 1)
	clock := func() time.Time {
		n := time.Now().Add(ahead)
		if armed.CompareAndSwap(true, false) {
			readNow <- struct{}{}
		}
		return n
	}
	s, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p),
		hooks.RedisClock(clock).(redisstore.Option), hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	if err != nil {
		t.Logf("New refused the lagging Redis: %v", err)
		return // refusing it is a fine answer
	}
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	ts, _ := idempotency.AttemptTime(k.AttemptID)
	_, err = s.Get(ctx, k)
	require.NoError(t, err)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))
	rk := recordKey(prefix, k)

	// The owner's FenceAttempt(1) reads the clock shortly before absence
	// stops being evidence, then waits for the only pooled connection.
	time.Sleep(ts.Add(-p.Skew + p.TTL - 300*time.Millisecond).Sub(clock()))
	held := c.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	done := make(chan error, 1)
	armed.Store(true)
	go func() {
		_, err := s.Fence(ctx, k, 1)
		done <- err
	}()
	<-readNow
	waitFor(t, 10*time.Second, "Redis removing the SUCCEEDED record", func() bool { return plain.Exists(ctx, rk).Val() == 0 })
	require.NoError(t, held.Close())
	t.Logf("the late Fence answered %v", <-done)

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	t.Logf("after the late Fence the key reads %v (fenced through %d)", rec.GetState(), rec.GetFencedThroughTry())
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 2 of a call whose try 1 SUCCEEDED started: a Redis clock behind the server's disabled the Fence script's staleness check")
}

package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// The helpers of the tests of calls that read the clock a while before
// their script runs (see redisstore.DefaultKeep).

// latePolicy is their policy: times short enough for records to expire
// during a test.
var latePolicy = idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
	MaxAttemptDeadline: 3 * time.Second, TTL: 3200 * time.Millisecond, MaxResponseBytes: 1024}

// armedClock is a store's clock, the real one shifted by off, that signals
// read the first time it is read after arm: the moment a call read the
// clock, before it waits for a connection.
type armedClock struct {
	off   time.Duration
	armed atomic.Bool
	read  chan struct{}
}

func newArmedClock(off time.Duration) *armedClock {
	return &armedClock{off: off, read: make(chan struct{}, 1)}
}

func (c *armedClock) now() time.Time {
	n := time.Now().Add(c.off)
	if c.armed.CompareAndSwap(true, false) {
		c.read <- struct{}{}
	}
	return n
}

func (c *armedClock) arm() { c.armed.Store(true) }

// onePoolClient returns a client of the shared Redis with one pooled
// connection, so that a test can hold it while a call waits; change may set
// more options.
func onePoolClient(t *testing.T, change func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, PoolSize: 1, PoolTimeout: 30 * time.Second}
	if change != nil {
		change(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// succeededCall starts the tenant's horizon on s, then runs try 1 of a new
// call, minted skew ahead of now, to SUCCEEDED. It returns the call's key
// and its attempt's time.
func succeededCall(t *testing.T, s *redisstore.Store, now func() time.Time, skew time.Duration) (idempotency.Key, time.Time) {
	t.Helper()
	ctx := context.Background()
	// The tenant's horizon starts before the call's attempt is minted, so
	// that the attempt lies inside it whatever millisecond each falls in.
	_, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(now()), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err)
	afterHorizon()
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(now().Add(skew)), Call: "0", Method: "/x.Y/Z"}
	ts, ok := idempotency.AttemptTime(k.AttemptID)
	require.True(t, ok)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))
	return k, ts
}

// afterHorizon waits until the millisecond after a horizon a Redis store
// just started: the store starts it at the later of the call's reading and
// Redis's time, from the next millisecond, and an attempt minted by the real
// clock in the same millisecond lies outside it.
func afterHorizon() { time.Sleep(2 * time.Millisecond) }

// lateFence sends FenceAttempt(1) of k (its records under prefix), whose
// attempt was created at ts, so that it reads the clock shortly before the
// absence of k's record stops being evidence, then waits for c's only pooled
// connection until Redis has removed the record; it returns the Fence's
// error.
func lateFence(t *testing.T, s *redisstore.Store, c, plain *redis.Client, prefix string, clk *armedClock, p idempotency.Policy, k idempotency.Key, ts time.Time) error {
	t.Helper()
	ctx := context.Background()
	rk := recordKey(prefix, k)
	time.Sleep(ts.Add(-p.Skew + p.TTL - 300*time.Millisecond).Sub(clk.now()))
	held := c.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	done := make(chan error, 1)
	clk.arm()
	go func() {
		_, err := s.Fence(ctx, k, 1)
		done <- err
	}()
	<-clk.read
	waitFor(t, 10*time.Second, "Redis removing the SUCCEEDED record", func() bool { return plain.Exists(ctx, rk).Val() == 0 })
	require.NoError(t, held.Close())
	return <-done
}

// succeedDone runs try 1 of k on s to SUCCEEDED, with response "done".
func succeedDone(t *testing.T, s *redisstore.Store, clock *storetest.Clock, k idempotency.Key) {
	t.Helper()
	ctx := context.Background()
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("done")}))
}

package redisstore_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"go.uber.org/goleak"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// downDialer dials real connections to Redis on which, while down is set,
// every write fails: a network blip, seen by the one command written
// during it.
type downDialer struct{ down atomic.Bool }

func (d *downDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &downConn{Conn: c, d: d}, nil
}

type downConn struct {
	net.Conn
	d *downDialer
}

var errDown = errors.New("test: network blip")

func (c *downConn) Write(b []byte) (int, error) {
	if c.d.down.Load() {
		return 0, errDown
	}
	return c.Conn.Write(b)
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// A node's check that fails refuses the node for a second, whatever made it
// fail: a check that could not reach the node (one lost write, a reset
// connection: a blip) is taken as a verdict on the node, as a wrong
// maxmemory-policy or a clock off is. Once a minute the first call to a
// node has its clock read again: a blip on that one TIME then refuses every
// call to the node for a second after the network is back, although Redis
// answers. A Begin is refused NOT_ADMITTED (with a retry-after of about
// 100 ms, so the repeats are refused too), and a Finish fails: the
// interceptor answers the try that ran UNKNOWN, and its record stays
// IN_PROGRESS until its lease ends, then reads ABANDONED. Only a check
// whose node answered wrong may refuse it; one that could not reach it
// fails its own callers, and the next call checks again. Here a check
// vouches for the node for 200 ms (hooks), the client does not retry, and
// the one call after that meets a blip: the Finish of a try begun before
// it must succeed.
func TestRedisNodeCheckBlipRefusesNothingAfter(t *testing.T) {
	admin, prefix := newClient(t)
	d := &downDialer{}
	c := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, ContextTimeoutEnabled: true, MaxRetries: -1, Dialer: d.dial})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, prefix, redisstore.WithPolicy(storetest.Policy()),
		hooks.RedisClockRecheckAfter(200*time.Millisecond).(redisstore.Option))
	ctx := context.Background()
	key := func(call string) idempotency.Key {
		return idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: call, Method: "/x.Y/Z"}
	}
	running := key("running")
	fp := idempotency.Fingerprint(running.Method, []byte("req"))
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: running, Try: 1, Fingerprint: fp, Deadline: time.Now().Add(10 * time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started)

	time.Sleep(250 * time.Millisecond) // past New's check: the next call reads the clock again
	d.down.Store(true)
	_, err = s.Get(ctx, key("blip"))
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a call during the blip")
	d.down.Store(false)

	// The network is back: Redis answers, and so must the store.
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: running, Try: 1, Fingerprint: fp,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok"), Minted: true}),
		"a Finish after a blip that one node check met was refused")
	again, err := s.Begin(ctx, idempotency.BeginRequest{Key: running, Try: 2, Fingerprint: fp, Deadline: time.Now().Add(10 * time.Second), Minted: true})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedFinished, again.Refusal, "the try's record was not finished")
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, again.Record.GetState())
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: key("after"), Try: 1, Fingerprint: fp, Deadline: time.Now().Add(10 * time.Second), Minted: true})
	require.NoError(t, err, "a Begin after a blip that one node check met was refused")
	require.True(t, res.Started)
}

// checkedEveryCall starts a Redis of the test's own (ownRedis) and returns
// a client of it, a store on that client (prefix "own:",
// storetest.Policy) that checks the node at every call, and a key of
// tenant acme that one Get has read: the node passed its check once.
func checkedEveryCall(t *testing.T) (*redis.Client, *redisstore.Store, idempotency.Key) {
	t.Helper()
	addr, _ := ownRedis(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, "own:", redisstore.WithPolicy(storetest.Policy()),
		hooks.RedisClockRecheckAfter(time.Nanosecond).(redisstore.Option)) // every call checks the node
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	_, err := s.Get(context.Background(), key)
	require.NoError(t, err)
	return c, s, key
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// A node's check runs in a goroutine of its own, detached from the calls
// that wait for it and bounded by 5 s, and nothing owns that goroutine:
// no Close stops it or waits for it, so it outlives the call that started
// it, the store's user, and a test (goleak). The store must have an owner
// for it: Close ends the checks that run and waits for them. Here Redis is
// paused, a call that needed a check gave up at its deadline, and once the
// store is closed no goroutine of its is left.
func TestRedisNodeCheckGoroutineEndsWithClose(t *testing.T) {
	c, s, key := checkedEveryCall(t)
	ctx := context.Background()
	before := goleak.IgnoreCurrent()

	require.NoError(t, c.Do(ctx, "CLIENT", "PAUSE", 3000, "ALL").Err())
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := s.Get(short, key)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	require.NoError(t, s.Close())
	goleak.VerifyNone(t, before)
	_, err = s.Get(ctx, key)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a closed store answered")
	require.ErrorContains(t, err, "closed")
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// A node's check runs on a context of its own, bounded by 5 s. When that
// bound ends it (Redis paused or slow), the check's error, which every
// call that waited for it gets, wraps context.DeadlineExceeded, although
// no caller's deadline passed: the AttemptService, which reads context
// errors before store errors, answers such a Get or Fence
// DEADLINE_EXCEEDED instead of NOT_ADMITTED STORE_UNAVAILABLE. A call
// whose own context is alive must get a store-unavailable error that says
// the check ran out of time, and does not read as its own deadline.
func TestRedisNodeCheckTimeoutIsNotCallersDeadline(t *testing.T) {
	c, s, key := checkedEveryCall(t)
	ctx := context.Background()

	require.NoError(t, c.Do(ctx, "CLIENT", "PAUSE", 8000, "ALL").Err())
	long, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := s.Get(long, key)
	require.NoError(t, long.Err())
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the check's own time limit reads as the caller's deadline")
	require.ErrorContains(t, err, "5s")
}

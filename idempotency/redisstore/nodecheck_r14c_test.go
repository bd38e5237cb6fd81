package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"go.uber.org/goleak"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// closeAfterWait is a go-redis hook that, once armed, closes the store in
// store as soon as a pipeline holding a WAIT has its reply: a shutdown
// that lands while a Begin is between its script's reply and what it does
// with it.
type closeAfterWait struct {
	armed atomic.Bool
	store atomic.Pointer[redisstore.Store]
}

func (h *closeAfterWait) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *closeAfterWait) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *closeAfterWait) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() == "wait" && h.armed.CompareAndSwap(true, false) {
				_ = h.store.Load().Close()
			}
		}
		return err
	}
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// Close makes every later store call fail, and the store refuses them in
// run, the one path every script takes, including the fence by which a
// Begin that failed after sending its script ends the try it may have
// begun (a WithReplicas shortfall, a lost reply). A Begin in progress when
// Close is called (a server stopped with Stop, whose handlers go on) thus
// has its own clean-up refused: the try that its script began, which no
// handler will run, reads IN_PROGRESS until its lease ends, then ABANDONED,
// and every later try of its call is refused in the meantime, where
// without Close it reads FENCED at once. Close is documented as safe
// concurrently with calls: a call it finds in progress must still end what
// it began. Here a Redis without replicas answers WAIT 1 with 0 (a
// shortfall), and the store is closed between that reply and Begin's fence.
func TestRedisCloseDuringBeginStillFencesItsTry(t *testing.T) {
	addr, _ := ownRedis(t)
	hook := &closeAfterWait{}
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	c.AddHook(hook)
	t.Cleanup(func() { _ = c.Close() })
	p := storetest.Policy()
	s := newStore(t, c, "own:", redisstore.WithPolicy(p), redisstore.WithReplicas(1, 10*time.Millisecond))
	hook.store.Store(s)
	reader := newStore(t, redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true}), "own:", redisstore.WithPolicy(p))

	ctx := context.Background()
	// The tenant's horizon starts, then k is minted skew ahead: inside it.
	_, err := reader.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(0), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err)
	afterHorizon()
	k := idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(p.Skew), Call: "0", Method: "/x.Y/Z"}
	hook.armed.Store(true)
	_, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(10 * time.Second), Minted: true})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a Begin whose WAIT fell short")
	require.False(t, hook.armed.Load(), "the store was not closed during the Begin")

	rec, err := reader.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(),
		"a Begin in progress when the store was closed left the try it began, which no handler runs, %v", rec.GetState())

	_, err = s.Get(ctx, k)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a call after Close")
	require.ErrorContains(t, err, "closed")
}

// Close while a node's check waits on a paused Redis, with calls waiting
// for that check and more arriving: Close must return once the check ends
// (no lock between Close and the node's check); a call in progress at
// Close may fail unavailable or go on, but never reads as its caller's
// deadline (none had one); every call after Close fails unavailable; and
// no goroutine of the store's is left. (A guard: the review found this
// sound.)
func TestRedisCloseDuringCheckWithConcurrentCalls(t *testing.T) {
	c, s, key := checkedEveryCall(t)
	ctx := context.Background()
	before := goleak.IgnoreCurrent()

	require.NoError(t, c.Do(ctx, "CLIENT", "PAUSE", 2000, "ALL").Err())
	type result struct {
		afterClose bool
		err        error
	}
	results := make(chan result, 64)
	var (
		wg     sync.WaitGroup
		closed atomic.Bool
	)
	for i := range 64 {
		wg.Go(func() {
			after := closed.Load()
			var err error
			if i%2 == 0 {
				_, err = s.Get(ctx, key)
			} else {
				_, err = s.Fence(ctx, key, 1)
			}
			results <- result{after, err}
		})
		if i == 32 {
			require.NoError(t, s.Close())
			closed.Store(true)
		}
	}
	wg.Wait()
	close(results)
	for r := range results {
		if r.afterClose {
			require.ErrorIs(t, r.err, idempotency.ErrStoreUnavailable, "a call after Close")
			require.ErrorContains(t, r.err, "closed")
		}
		// A call in progress at Close may end either way: its check ran
		// into Close, or passed, and the call went on.
		require.NotErrorIs(t, r.err, context.DeadlineExceeded, "no caller had a deadline")
		require.NotErrorIs(t, r.err, context.Canceled, "no caller was canceled")
	}
	goleak.VerifyNone(t, before)
}

package redisstore_test

import (
	"context"
	"net"
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

// A review suspected that the fence a failed Begin sends (endBegun,
// bounded by 100 ms, dialing included) may time out before it is even sent
// when dialing is slow (a loaded machine, a remote Redis), and asked whether
// the outcome is then still reported honestly. It is, at a cost in
// precision only: Begin fails unavailable (the server answers NOT_ADMITTED
// STORE_UNAVAILABLE, and indeed no handler ran), the try Redis began reads
// IN_PROGRESS until its lease ends (d + skew) and ABANDONED after it, so
// every later try of the call is refused and an owner's FenceAttempt ends
// the call UNKNOWN: no try runs twice, nothing reads UNSEEN or FENCED. Here
// the production bound is kept and the fence's dial does not finish within
// it. (go-redis 9.23 dials in a goroutine of its own, on a context detached
// from the caller's: the dial finishes later, and its connection goes to the
// pool, but the fence that waited for it is not sent.)
func TestRedisFailedBeginFenceThatCannotDialLeavesTryInProgress(t *testing.T) {
	_, prefix := newClient(t)
	b := &blipDialer{lossyDialer: &lossyDialer{mode: lossEOF}}
	var hang atomic.Bool // the next dial after the blip waits for release
	hang.Store(true)
	release, hung := make(chan struct{}), make(chan struct{})
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if b.lost.Load() > 0 && !b.blip.Load() && hang.CompareAndSwap(true, false) {
				close(hung)
				<-release
			}
			return b.dial(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = c.Close() })
	l := newLossyStore(t, c, b.lossyDialer, prefix, hooks.RedisFailedBeginFenceTimeout(100*time.Millisecond).(redisstore.Option))
	c.AddHook(blipEnds{b})
	ctx := context.Background()

	b.blip.Store(true)
	b.arm()
	req := l.begin()
	_, err := l.s.Begin(ctx, req)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "Begin reports the store unavailable")
	require.Equal(t, int32(1), b.lost.Load(), "the script ran and its reply was lost")
	<-hung         // the fence had to dial, and its dial did not finish
	close(release) // before the fence gave up: Begin, which waits for it, returned

	rec, err := l.s.Get(ctx, l.key)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState(), "the fence never reached Redis")
	res, err := l.s.Begin(ctx, idempotency.BeginRequest{Key: l.key, Try: 2, Fingerprint: lossyFingerprint, Deadline: req.Deadline})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedInProgress, res.Refusal, "no later try runs while the begun one may")

	l.clock.Advance(req.Deadline.Add(storetest.Policy().Skew).Sub(l.clock.Now())) // the lease ends
	rec, err = l.s.Fence(ctx, l.key, 1)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, rec.GetState(), "an owner's FenceAttempt reads ABANDONED: UNKNOWN, never FENCED")
	res, err = l.s.Begin(ctx, idempotency.BeginRequest{Key: l.key, Try: 2, Fingerprint: lossyFingerprint, Deadline: req.Deadline.Add(time.Second)})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedAbandoned, res.Refusal)
}

package redisstore_test

import (
	"context"
	"net"
	"strings"
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

// CI found TestRedisFenceReplyLost/ReadTimeout reading UNKNOWN where it
// expected FENCED, once, on a loaded 2-core machine. The lossy harness
// started its clock storetest.ClockLead (1 s) ahead of real time, then
// built the store (New's checks and script loads, each a round trip on a
// fresh connection) and only then started the tenant's horizon, which a
// script moves to the later of the call's reading and Redis's TIME. When
// the machine took more than the lead to get there, the horizon followed
// Redis's TIME, past the clock: the harness's key, minted a skew after the
// clock's start, lay before horizon + skew, and every call on it read
// UNKNOWN. Here the first dial takes longer than the lead, as a loaded
// machine's New can.
func TestLossyHarnessKeyInsideHorizonAfterSlowStart(t *testing.T) {
	_, prefix := newClient(t)
	d := &lossyDialer{mode: lossTimeout}
	var slow atomic.Bool
	slow.Store(true)
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if slow.CompareAndSwap(true, false) { // New's first dial
				time.Sleep(storetest.ClockLead + 200*time.Millisecond)
			}
			return d.dial(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = c.Close() })
	l := newLossyStore(t, c, d, prefix)
	rec, err := l.s.Fence(context.Background(), l.key, 1)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the harness's key lies inside the horizon")
}

// CI found TestRedisBeginRetriedIntoDialErrorIsFenced reading IN_PROGRESS
// where it expected FENCED, once, on a loaded 2-core machine. The fence a
// failed Begin sends (endBegun) is best effort, bounded by 100 ms
// (failedBeginFenceTimeout): the Begin's connection is gone, so the fence
// dials a new one, says HELLO, and runs its script, and a loaded machine
// running the race detector can take longer than that. The fence then
// fails, and the try reads IN_PROGRESS until its lease ends, as the store
// documents for a fence that does not arrive. The tests that check the
// fence ends the try give it the time a loaded machine needs
// (hooks.RedisFailedBeginFenceTimeout, in newLossyStore). Here the dial
// after the blip takes 300 ms.
func TestLossyHarnessFenceOfFailedBeginSurvivesSlowDial(t *testing.T) {
	_, prefix := newClient(t)
	b := &blipDialer{lossyDialer: &lossyDialer{mode: lossEOF}}
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if b.lost.Load() > 0 && !b.blip.Load() {
				time.Sleep(300 * time.Millisecond) // the fence's dial, on a loaded machine
			}
			return b.dial(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = c.Close() })
	l := newLossyStore(t, c, b.lossyDialer, prefix)
	c.AddHook(blipEnds{b})

	b.blip.Store(true)
	b.arm()
	_, err := l.s.Begin(context.Background(), l.begin())
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.Equal(t, int32(1), b.lost.Load(), "the script ran and its reply was lost")
	rec, err := l.s.Get(context.Background(), l.key)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the fence ended the try")
}

// The conformance suite had the same flaw as the lossy harness: its clock
// started storetest.ClockLead ahead of real time before the harness built
// the store, and a horizon a Redis script starts follows Redis's TIME when
// that is later, while the suite takes the horizon to lie at its clock's
// start. Here the harness takes longer than the lead to build the store, as
// a loaded machine's New can, in the subtests that read the horizon's place.
func TestConformanceAfterSlowNew(t *testing.T) {
	slow := map[string]bool{"GetAbsentIsUnseen": true, "LossMovesHorizon": true, "MintedSkipsOnlyHorizonPlusSkew": true}
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock, p idempotency.Policy) storetest.Harness {
		c, prefix := newClient(t)
		s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
		if slow[t.Name()[strings.LastIndex(t.Name(), "/")+1:]] {
			time.Sleep(storetest.ClockLead + 200*time.Millisecond)
		}
		return storetest.Harness{Store: s, Lose: func(t *testing.T) { deletePrefix(t, c, prefix) }}
	})
}

package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// jumpClock is a server's wall clock that reads the real time until told to
// jump: New checks the clock once, and a clock stepped afterwards (an NTP
// step, a resumed VM) is seen only by the scripts.
type jumpClock struct{ off atomic.Int64 }

func (c *jumpClock) now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// to makes the clock read t now.
func (c *jumpClock) to(t time.Time) { c.off.Store(int64(time.Until(t))) }

// A review found that Get vouched for an absence by a clock that jumped
// backward after New, further than the keep: server A ran a call to
// SUCCEEDED; Redis removed its record, as it should, a keep after its
// expiry; server B, whose clock then read the attempt's own time, still
// judged the absence evidence (now < ts - skew + TTL) and GetAttempt
// answered UNSEEN for a call that SUCCEEDED (DESIGN §3.8). B's Begin and
// Fence were refused, as their scripts compare the call's reading with
// Redis's TIME (stale); Get's script did not. Real Redis, real clocks; only
// the keep is short (hooks.RedisKeep), and B's clock is stepped back.
func TestRedisGetAfterBackwardClockJumpVouchesForRemovedRecord(t *testing.T) {
	plain, prefix := newClient(t)
	p := latePolicy
	short := hooks.RedisKeep(300 * time.Millisecond).(redisstore.Option)
	a := newStore(t, plain, prefix, redisstore.WithPolicy(p), short)
	var bClock jumpClock
	b := newStore(t, plain, prefix, redisstore.WithPolicy(p), short, hooks.RedisClock(bClock.now).(redisstore.Option))
	ctx := context.Background()

	k, ts := succeededCall(t, a, time.Now, p.Skew)
	rk := recordKey(prefix, k)
	waitFor(t, 2*p.TTL+10*time.Second, "Redis removing the record a keep after its expiry", func() bool {
		return plain.Exists(ctx, rk).Val() == 0
	})

	bClock.to(ts) // B's clock steps back to the attempt's time
	rec, err := b.Get(ctx, k)
	if err == nil {
		require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState(),
			"GetAttempt vouched for the absence of a SUCCEEDED call's record, judged by a clock that jumped back")
	} else {
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	}
	// Begin and Fence already refuse that clock.
	_, err = b.Fence(ctx, k, 1)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	_, err = b.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: bClock.now().Add(time.Second)})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
}

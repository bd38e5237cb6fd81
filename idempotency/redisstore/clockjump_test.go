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

// jumpClock is a server's wall clock that reads the real time until told to
// jump: New checks the clock once, and a clock stepped afterwards (an NTP
// step, a resumed VM) is seen only by the scripts.
type jumpClock struct{ off atomic.Int64 }

func (c *jumpClock) now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// to makes the clock read t now.
func (c *jumpClock) to(t time.Time) { c.off.Store(int64(time.Until(t))) }

// shortKeepPair is two stores on one Redis key prefix, both with latePolicy
// and a keep of 300 ms (hooks.RedisKeep): a reads the real clock, b the
// returned jumpClock, which the test steps. plain is their client.
func shortKeepPair(t *testing.T) (plain *redis.Client, prefix string, a, b *redisstore.Store, bClock *jumpClock) {
	t.Helper()
	plain, prefix = newClient(t)
	short := hooks.RedisKeep(300 * time.Millisecond).(redisstore.Option)
	a = newStore(t, plain, prefix, redisstore.WithPolicy(latePolicy), short)
	bClock = new(jumpClock)
	b = newStore(t, plain, prefix, redisstore.WithPolicy(latePolicy), short, hooks.RedisClock(bClock.now).(redisstore.Option))
	return plain, prefix, a, b, bClock
}

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
	plain, prefix, a, b, bClock := shortKeepPair(t)
	p := latePolicy
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

// A review found that Redis kept a record for its writer's TTL plus the
// keep, counted from the write in real time, while readers vouch for its
// absence until the attempt's ts - skew + TTL by their own clocks: server B,
// whose clock was stepped forward after New further than the keep, began
// and finished a call of an attempt created by that clock (B minted it, or
// a client stepped alike did); Redis removed the record while, by a right
// clock, the attempt was young, and server A then answered UNSEEN and began
// try 2 of the call that SUCCEEDED (DESIGN §3.7, §3.8). Redis now keeps a
// record until ts - skew + TTL by its own clock, plus the keep, whatever the
// writer's clock read. Real Redis, real clocks; the keep is short and B's
// clock stepped 5 s forward.
func TestRedisRecordOfClockSteppedForwardOutlivesEvidence(t *testing.T) {
	_, _, a, b, bClock := shortKeepPair(t)
	p := latePolicy
	ctx := context.Background()

	// The tenant's horizon starts by a right clock.
	_, err := a.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err)
	afterHorizon()

	step := 5 * time.Second
	bClock.to(time.Now().Add(step))
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(bClock.now()), Call: "0", Method: "/x.Y/Z"}
	ts, _ := idempotency.AttemptTime(k.AttemptID)
	res, err := b.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: bClock.now().Add(time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	require.NoError(t, b.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, Minted: true,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))

	// By a right clock, the attempt lies inside the horizon from ts - skew,
	// and its absence is evidence until ts - skew + TTL.
	time.Sleep(time.Until(ts.Add(-p.Skew + 50*time.Millisecond)))
	require.Less(t, time.Now(), ts.Add(-p.Skew+p.TTL-time.Second), "the test ran too slowly to say anything")
	rec, err := a.Get(ctx, k)
	require.NoError(t, err)
	require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState(),
		"a call that SUCCEEDED reads UNSEEN: Redis removed its record by its writer's stepped clock")
	res, err = a.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started, "try 2 of a call whose try 1 SUCCEEDED started")
}

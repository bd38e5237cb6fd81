package redisstore_test

import (
	"context"
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

// Horizon keys used to live for ever, so that every tenant name a store
// ever saw (a trusted peer's made-up names included) kept some 200 bytes of
// Redis until someone deleted them. They now expire once their tenant is
// idle (WithIdleTenantExpiry), and never before a record of their tenant.

// idlePolicy is a policy small enough for keys to expire within a test:
// records live the TTL plus a keep of some 1.5 s (idleKeep plus twice the
// skew and a second). A script must run within idleKeep + skew of its
// call's reading of the clock (see redisstore.DefaultKeep): half a second,
// for a loaded machine.
func idlePolicy() idempotency.Policy {
	return idempotency.Policy{Skew: 20 * time.Millisecond, MaxAttemptDeadline: 500 * time.Millisecond,
		TTL: 600 * time.Millisecond, MaxResponseBytes: 1024}
}

const (
	shortIdle = 700 * time.Millisecond
	idleKeep  = 500 * time.Millisecond
)

func idleStore(t *testing.T, c redis.UniversalClient, prefix string, idle time.Duration) *redisstore.Store {
	t.Helper()
	return newStore(t, c, prefix, redisstore.WithPolicy(idlePolicy()), redisstore.WithIdleTenantExpiry(idle),
		hooks.RedisKeep(idleKeep).(redisstore.Option))
}

func lookUp(t *testing.T, s *redisstore.Store, tenant string) {
	t.Helper()
	_, err := s.Get(context.Background(), idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(time.Now()), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err)
}

func pttl(t *testing.T, c *redis.Client, key string) time.Duration {
	t.Helper()
	d, err := c.PTTL(context.Background(), key).Result()
	require.NoError(t, err)
	return d
}

// succeedIdle runs try 1 of a new call of tenant acme to SUCCEEDED on s,
// whose tenant's horizon began at least the skew ago, and returns its
// record's key.
func succeedIdle(t *testing.T, s *redisstore.Store, prefix string) string {
	t.Helper()
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(400 * time.Millisecond)})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")}))
	return prefix + "{t:acme}:r|" + k.AttemptID + "|0|/x.Y/Z"
}

func TestRedisHorizonKeyExpiresWhenItsTenantIsIdle(t *testing.T) {
	c, prefix := newClient(t)
	s := idleStore(t, c, prefix, shortIdle)
	hk := prefix + "{t:acme}:h"
	ctx := context.Background()

	lookUp(t, s, "acme")
	left := pttl(t, c, hk)
	require.Positive(t, left, "a new horizon key expires")
	require.LessOrEqual(t, left, shortIdle)
	waitFor(t, 5*time.Second, "the idle tenant's horizon key to expire", func() bool {
		return c.Exists(ctx, hk).Val() == 0
	})

	// A record keeps its tenant's key: the key expires after the record,
	// never before, although the record lives longer than the idle time.
	lookUp(t, s, "acme")
	time.Sleep(idlePolicy().Skew + 2*time.Millisecond)
	rk := succeedIdle(t, s, prefix)
	require.Greater(t, pttl(t, c, rk), shortIdle, "the record outlives the idle time: this test needs it to")
	require.GreaterOrEqual(t, pttl(t, c, hk), pttl(t, c, rk))
	sawRecord := false
	waitFor(t, 10*time.Second, "the record and then its tenant's horizon key to expire", func() bool {
		var h, r *redis.IntCmd
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			h, r = p.Exists(ctx, hk), p.Exists(ctx, rk)
			return nil
		})
		require.NoError(t, err)
		require.False(t, r.Val() == 1 && h.Val() == 0, "the horizon key expired while a record of its tenant lived")
		sawRecord = sawRecord || r.Val() == 1
		return h.Val() == 0
	})
	require.True(t, sawRecord)
	require.Zero(t, c.Exists(ctx, rk).Val())
}

// A replica configured never to expire horizon keys still keeps one that
// another replica gave an expiry alive as long as the records it writes.
func TestRedisHorizonKeyOutlivesRecordsOfAStoreThatNeverExpiresIt(t *testing.T) {
	c, prefix := newClient(t)
	expiring := idleStore(t, c, prefix, shortIdle)
	forever := idleStore(t, c, prefix, 0)
	hk := prefix + "{t:acme}:h"

	lookUp(t, expiring, "acme")
	require.Positive(t, pttl(t, c, hk))
	lookUp(t, forever, "acme")
	require.Positive(t, pttl(t, c, hk), "a store with no idle expiry leaves another's expiry in place")
	time.Sleep(idlePolicy().Skew + 2*time.Millisecond)
	rk := succeedIdle(t, forever, prefix)
	require.GreaterOrEqual(t, pttl(t, c, hk), pttl(t, c, rk))
}

// Keys written by a store that never expired them get an expiry at their
// tenant's next call to one that does; a store with no idle expiry writes
// keys without one. Records such a store (or an older version) wrote did
// not hold the key, so it is given at least the longest a record lives:
// the TTL, the keep (here twice the skew and a second), the skew and a
// second.
func TestRedisIdleTenantExpiryReachesOlderKeys(t *testing.T) {
	c, prefix := newClient(t)
	p := idlePolicy()
	hk := prefix + "{t:acme}:h"
	lookUp(t, idleStore(t, c, prefix, 0), "acme")
	require.Equal(t, time.Duration(-1), pttl(t, c, hk))
	lookUp(t, idleStore(t, c, prefix, shortIdle), "acme")
	longest := p.TTL + idleKeep + 2*p.Skew + time.Second + p.Skew + time.Second
	left := pttl(t, c, hk)
	require.Greater(t, left, longest-200*time.Millisecond)
	require.LessOrEqual(t, left, longest)
}

// A tenant name whose only call is refused (an attempt outside the horizon
// it just created) still leaves a key that expires.
func TestRedisRefusedFirstCallLeavesAnExpiringKey(t *testing.T) {
	c, prefix := newClient(t)
	s := idleStore(t, c, prefix, shortIdle)
	k := idempotency.Key{Tenant: "made-up", AttemptID: storetest.AttemptIDAt(time.Now().Add(-time.Minute)), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(context.Background(), idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(400 * time.Millisecond)})
	require.NoError(t, err)
	require.False(t, res.Started)
	require.NotNil(t, res.Refusal)
	left := pttl(t, c, prefix+"{t:made-up}:h")
	require.Positive(t, left)
	require.LessOrEqual(t, left, shortIdle)
}

func TestRedisIdleTenantExpiryDefaultAndBounds(t *testing.T) {
	c, prefix := newClient(t)
	lookUp(t, newStore(t, c, prefix), "acme")
	left := pttl(t, c, prefix+"{t:acme}:h")
	require.Greater(t, left, redisstore.DefaultIdleTenantExpiry-redisstore.DefaultIdleTenantExpiry/16)
	require.LessOrEqual(t, left, redisstore.DefaultIdleTenantExpiry)

	p := idlePolicy()
	for _, d := range []time.Duration{-time.Second, p.TTL - time.Millisecond} {
		_, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p), redisstore.WithIdleTenantExpiry(d))
		require.ErrorContains(t, err, "WithIdleTenantExpiry", "d = %v", d)
	}
	for _, d := range []time.Duration{0, p.TTL} {
		s, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p), redisstore.WithIdleTenantExpiry(d))
		require.NoError(t, err, "d = %v", d)
		require.NoError(t, s.Close())
	}
}

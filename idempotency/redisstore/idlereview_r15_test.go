package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A store that never expires horizon keys (WithIdleTenantExpiry(0)) leaves
// a key without an expiry as it is when it writes a record; a store that
// expires them gives such a key LONGEST (the TTL, the keep, the skew and a
// second), the longest a record lives when its try's deadline is at most
// the policy's MaxAttemptDeadline away and clocks agree. A record may live
// longer: the Store accepts a deadline further ahead (its record lives
// until the deadline plus the skew and the grace, idempotency.Policy.TTL),
// and a writer whose clock runs ahead of Redis's has it kept until its
// floor by Redis's clock. The key must still outlive that record: else the
// next call moves the horizon and the running try's Finish is refused (its
// result lost).
func TestR15HorizonKeyOutlivesALongRecordOfAStoreThatNeverExpiresIt(t *testing.T) {
	c, prefix := newClient(t)
	p := idlePolicy()
	forever := idleStore(t, c, prefix, 0)
	expiring := idleStore(t, c, prefix, p.TTL)
	hk := prefix + "{t:acme}:h"
	ctx := context.Background()

	lookUp(t, forever, "acme")
	require.Equal(t, time.Duration(-1), pttl(t, c, hk))
	time.Sleep(p.Skew + 2*time.Millisecond)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := forever.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(4 * time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	rk := prefix + "{t:acme}:r|" + k.AttemptID + "|0|/x.Y/Z"
	require.Greater(t, pttl(t, c, rk), 4*time.Second, "the record lives past its deadline: this test needs it to")
	require.Equal(t, time.Duration(-1), pttl(t, c, hk), "a store with no idle expiry gives a key none")

	lookUp(t, expiring, "acme") // gives the key an expiry
	require.GreaterOrEqual(t, pttl(t, c, hk), pttl(t, c, rk), "the horizon key would expire before a record of its tenant")

	// Past the expiry the key got (LONGEST: about 3.2 s), the running try
	// still ends.
	time.Sleep(3500 * time.Millisecond)
	require.Equal(t, int64(1), c.Exists(ctx, rk).Val())
	require.NoError(t, forever.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")}))
}

// r15Needs is what New's error says the store's Redis user needs, when
// Redis refuses one of New's commands to it.
var r15Needs = []string{"CONFIG GET", "INFO", "TIME", "SCRIPT LOAD", "EVALSHA", "EVAL",
	"HMGET", "HSET", "EXISTS", "PEXPIRE", "PTTL", "ZADD", "ZCOUNT", "ZREMRANGEBYSCORE"}

// New's error for a command Redis refuses to the store's user names the
// commands the user needs. A user granted just those (and the keys under
// the store's prefix) must be able to use the store: the scripts' own
// commands are checked against the user's ACL too, and a script the
// store sends without loading it first (the finish of a full Redis) or
// after Redis lost it (NOSCRIPT) is sent with EVAL.
func TestR15NewNamesEveryCommandTheStoresUserNeeds(t *testing.T) {
	addr, _ := ownRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~own:*", "-@all", "+info", "+time").Err())
	c := redis.NewClient(&redis.Options{Addr: addr, Username: "app", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })

	_, err := redisstore.New(ctx, c, redisstore.WithPrefix("own:"))
	require.ErrorContains(t, err, "NOPERM")
	for _, cmd := range r15Needs {
		require.Regexp(t, `[ (,]`+cmd+`[,) ]`, err.Error())
	}

	grant := []any{"ACL", "SETUSER", "app"}
	for _, cmd := range r15Needs {
		grant = append(grant, "+"+strings.ReplaceAll(strings.ToLower(cmd), " ", "|"))
	}
	require.NoError(t, admin.Do(ctx, grant...).Err())
	s, err := redisstore.New(ctx, c, redisstore.WithPrefix("own:"), redisstore.WithMaxRecordsPerTenant(10))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	lookUp(t, s, "acme")
	time.Sleep(idempotency.DefaultPolicy().Skew + 2*time.Millisecond)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	// Redis loses its scripts: the next ones are sent with EVAL.
	require.NoError(t, admin.ScriptFlush(ctx).Err())
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")}))
	_, err = s.Fence(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "1", Method: "/x.Y/Z"}, 1)
	require.NoError(t, err)
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
}

// Redis refusing the store's credentials (a wrong password: WRONGPASS; none
// given to a Redis that asks for one: NOAUTH) is a setting as much as a
// refused command: waiting does not heal it, and New must not report it as
// an unreachable Redis (idempotency.ErrStoreUnavailable), which a caller
// would retry for ever.
func TestR15NewReportsRefusedCredentialsAsASetting(t *testing.T) {
	addr, _ := ownRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.ConfigSet(ctx, "requirepass", "pw").Err())
	for _, o := range []*redis.Options{
		{Addr: addr, Password: "wrong", ContextTimeoutEnabled: true},
		{Addr: addr, ContextTimeoutEnabled: true},
	} {
		c := redis.NewClient(o)
		_, err := redisstore.New(ctx, c, redisstore.WithPrefix("own:"))
		_ = c.Close()
		require.Error(t, err)
		require.NotErrorIs(t, err, idempotency.ErrStoreUnavailable, "password %q", o.Password)
		require.ErrorContains(t, err, "credentials")
	}
	c := redis.NewClient(&redis.Options{Addr: addr, Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(ctx, c, redisstore.WithPrefix("own:"))
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

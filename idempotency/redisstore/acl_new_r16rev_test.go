package redisstore_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
)

// A review found that New runs no script, so a store user that lacks, from
// the start, a command only the scripts run (HSET, say) passes New, and its
// first call fails with an error saying that the user's ACL changed since
// New — which it did not: the operator looks for a change that never
// happened. The error now names that case too. It runs a Redis of its own,
// on a port chosen at run time.
func TestRedisStoreNamesAScriptCommandRefusedFromTheStart_r16rev(t *testing.T) {
	addr, _ := r16Server(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-hset").Err())
	c := redis.NewClient(&redis.Options{Addr: addr, Username: "app", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, "r16rev-acl:") // New runs no script: it cannot see the missing HSET
	_, started, err := r16Begin(s, "first")
	require.False(t, started)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorContains(t, err, "needs CONFIG GET, INFO, TIME, SCRIPT LOAD, EVALSHA, EVAL")
	require.ErrorContains(t, err, "a command only the store's scripts run, which New does not try")
}

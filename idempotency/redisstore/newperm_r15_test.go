package redisstore_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// New filed a command Redis refused to the store's ACL user (NOPERM) as
// idempotency.ErrStoreUnavailable, the error of a Redis that cannot be
// reached, which a caller would retry for ever. It is a setting: the error
// says what Redis answered and what the store's user needs, and does not
// match ErrStoreUnavailable. A Redis that answers, with the commands
// granted back, passes.
func TestRedisNewReportsARefusedCommandAsASetting(t *testing.T) {
	addr, _ := ownRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config").Err())
	c := redis.NewClient(&redis.Options{Addr: addr, Username: "app", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })

	_, err := redisstore.New(ctx, c, redisstore.WithPrefix("own:"))
	require.Error(t, err)
	require.NotErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorContains(t, err, "NOPERM")
	require.ErrorContains(t, err, "needs CONFIG GET")

	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "+config").Err())
	s, err := redisstore.New(ctx, c, redisstore.WithPrefix("own:"))
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

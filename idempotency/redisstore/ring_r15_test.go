package redisstore_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// The review found that New accepted a *redis.Ring (any UniversalClient
// but a Client or a ClusterClient), and ran its checks on the client as on
// one server: a Ring sends CONFIG GET, INFO and TIME to one shard, so New
// checked one of its Redis servers, a different one each time, and the
// calls' checks (ready) likewise. Here one shard of two has
// maxmemory-policy allkeys-lru, which evicts records: New passed about half
// the time. The store knows how to check every node of a Client or a
// ClusterClient only: New must refuse any other client, as a setting.
func TestRedisNewRefusesARing(t *testing.T) {
	ctx := context.Background()
	a, _ := emptyMapRedis(t, false)
	b, bc := emptyMapRedis(t, false)
	require.NoError(t, bc.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a, "b": b}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = ring.Close() })
	for range 10 {
		s, err := redisstore.New(ctx, ring)
		if err == nil {
			_ = s.Close()
		}
		require.Error(t, err, "New checked one shard of a Ring whose other evicts records")
		require.NotErrorIs(t, err, idempotency.ErrStoreUnavailable, "a setting: waiting does not change the client")
		require.ErrorContains(t, err, "*redis.Ring")
	}
}

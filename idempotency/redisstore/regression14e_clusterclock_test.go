package redisstore_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// timeSeen is a go-redis hook that notes the nodes a TIME was sent to.
type timeSeen struct {
	addr string
	mu   *sync.Mutex
	seen map[string]bool
}

func (h timeSeen) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h timeSeen) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "time") {
			h.mu.Lock()
			h.seen[h.addr] = true
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (h timeSeen) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A review found that New's clock check, which exists so that a Redis whose clock
// runs far ahead is refused at New "instead of a store that answers
// STORE_UNAVAILABLE to everything"; on a Cluster, every primary runs the
// scripts of its own tenants against its own TIME, and each may run another
// machine's clock. New checks maxmemory-policy and hz on every node
// (eachNode), but reads TIME from one: a ClusterClient sends a command
// without keys to a single shard. The Cluster's primaries must each have
// their clock read.
func TestRegression14eRedisClusterNewReadsEveryPrimarysClock(t *testing.T) {
	_, prefix := newClusterClient(t) // skips without a Cluster; cleans the prefix
	var mu sync.Mutex
	seen := map[string]bool{}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	c.OnNewNode(func(n *redis.Client) { n.AddHook(timeSeen{addr: n.Options().Addr, mu: &mu, seen: seen}) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := redisstore.New(ctx, c, redisstore.WithPrefix(prefix))
	require.NoError(t, err)

	var masters []string
	require.NoError(t, c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, n.Options().Addr)
		return nil
	}))
	mu.Lock()
	defer mu.Unlock()
	var unchecked []string
	for _, a := range masters {
		if !seen[a] {
			unchecked = append(unchecked, a)
		}
	}
	require.Empty(t, unchecked, "New read TIME on %v only; the clocks of primaries %v were never compared with the server's", seen, unchecked)
}

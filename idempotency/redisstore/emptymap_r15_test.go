package redisstore_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// A review found that New succeeded, having checked no node at all, when
// the Cluster client's map was empty: seeded with a node that joined no
// Cluster (or one whose slots are not assigned yet), go-redis reads an
// empty CLUSTER SLOTS, and New's checks "on every node the client knows"
// ran on none (loading the scripts, too, went to none). Calls still check
// the node they reach first, so nothing unsafe ran, but New vouched for a
// Redis it never reached. New must fail unavailable, naming the addresses
// the client knows, and pass once the node serves the slots. These tests
// run servers of their own, on ports chosen at run time.

// emptyMapRedis starts a redis-server of the test's own on a free port
// (redisstore.StartOnPortForTest; with a Cluster bus on port+10000 when
// cluster is true: cluster-enabled, no slots), killed at cleanup, and
// returns its address and a client of it.
func emptyMapRedis(t *testing.T, cluster bool) (string, *redis.Client) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "no redis-server binary: "+err.Error())
	}
	port, cmd, exited := redisstore.StartOnPortForTest(t, bin, 0, func(port int) []string {
		args := []string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", t.TempDir(), "--maxmemory-policy", "noeviction"}
		if cluster {
			args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-port", fmt.Sprint(port+10000), "--cluster-node-timeout", "2000")
		}
		return args
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	require.Eventually(t, func() bool {
		info := c.InfoMap(ctx, "server")
		return info.Err() == nil && info.Item("Server", "process_id") == fmt.Sprint(cmd.Process.Pid)
	}, 10*time.Second, 20*time.Millisecond, "the redis-server of the test's own answering at %s", addr)
	return addr, c
}

func TestRedisNewRefusesAClusterClientThatKnowsNoNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("a seed that serves no slots", func(t *testing.T) {
		addr, node := emptyMapRedis(t, true)
		slots, err := node.Do(ctx, "CLUSTER", "SLOTS").Slice()
		require.NoError(t, err)
		require.Empty(t, slots, "the node joined no Cluster")

		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(ctx, c, redisstore.WithPrefix("emptymap:"))
		if err == nil {
			_ = s.Close()
		}
		require.Error(t, err, "New checked no node, and vouched for the Cluster")
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "slots may be assigned later: waiting may help")
		require.ErrorContains(t, err, addr, "the error names the addresses the client knows")
		require.ErrorContains(t, err, "no node serving slots")

		// The same client, once the node serves every slot, passes: its
		// checks run on the node.
		require.NoError(t, node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err())
		require.Eventually(t, func() bool {
			info, err := node.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		}, 10*time.Second, 20*time.Millisecond)
		s, err = redisstore.New(ctx, c, redisstore.WithPrefix("emptymap:"))
		require.NoError(t, err)
		require.NoError(t, s.Close())
		require.Positive(t, scriptCount(t, ctx, node), "New loaded its scripts on the node")
	})

	t.Run("a ClusterSlots function that names no node", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{
			ClusterSlots:          func(context.Context) ([]redis.ClusterSlot, error) { return nil, nil },
			ContextTimeoutEnabled: true,
		})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(ctx, c)
		if err == nil {
			_ = s.Close()
		}
		require.Error(t, err)
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
		require.ErrorContains(t, err, "no node serving slots")
	})

	t.Run("a seed that cannot be reached", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{fmt.Sprintf("127.0.0.1:%d", redisstore.OwnPortForTest(t))}, ContextTimeoutEnabled: true,
			DialTimeout: 200 * time.Millisecond, MaxRedirects: -1})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(ctx, c)
		if err == nil {
			_ = s.Close()
		}
		require.Error(t, err)
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "Redis cannot be reached")
	})

	t.Run("a plain client, and a Cluster client of a Redis without Cluster mode", func(t *testing.T) {
		addr, _ := emptyMapRedis(t, false)
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(ctx, c)
		require.NoError(t, err)
		require.NoError(t, s.Close())

		// A setting: waiting does not make the Redis a Cluster.
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = cc.Close() })
		s, err = redisstore.New(ctx, cc)
		if err == nil {
			_ = s.Close()
		}
		require.Error(t, err)
		require.NotErrorIs(t, err, idempotency.ErrStoreUnavailable)
		require.ErrorContains(t, err, "not a Cluster")
	})

	t.Run("the shared Cluster", func(t *testing.T) {
		// Read-only use: New reads the nodes' settings and loads the
		// scripts; it writes no key.
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			skipOrFail(t, fmt.Sprintf("no Redis Cluster answers at %s (%s): %v", strings.Join(clusterAddrs(), ","), topologyHint, err))
		}
		s, err := redisstore.New(ctx, c, redisstore.WithReplicas(1, 100*time.Millisecond))
		require.NoError(t, err)
		require.NoError(t, s.Close())
	})
}

// scriptCount returns how many scripts node c holds (INFO memory's
// number_of_cached_scripts).
func scriptCount(t *testing.T, ctx context.Context, c *redis.Client) int {
	t.Helper()
	v, err := infoField(ctx, c, "memory", "number_of_cached_scripts")
	require.NoError(t, err)
	var n int
	_, err = fmt.Sscan(v, &n)
	require.NoError(t, err)
	return n
}

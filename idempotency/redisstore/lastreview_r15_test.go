package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// A review of New's refusal of clients other than *redis.Client and
// *redis.ClusterClient, and of its failing when the Cluster map names no
// node, checked that every set-up go-redis builds for a supported topology
// still passes New: a Cluster client seeded with a replica only, reading
// from replicas (ReadOnly, RouteByLatency, RouteRandomly), one with a
// ClusterSlots function, the clients NewUniversalClient returns, and a
// Sentinel-managed Redis (NewFailoverClient, and
// NewUniversalClient with MasterName). The Sentinel tests run servers of
// their own, on ports chosen at run time.

func newStoreOK(t *testing.T, ctx context.Context, c redis.UniversalClient) {
	t.Helper()
	s, err := redisstore.New(ctx, c, redisstore.WithPrefix("lastreview-r15:"))
	require.NoError(t, err, "client %T", c)
	require.NoError(t, s.Close())
}

func TestRedisNewTakesEverySupportedClusterClient(t *testing.T) {
	probe, _ := newClusterClient(t) // skips (or fails) without the Cluster
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	//lint:ignore SA1019 a ClusterSlots function returns what CLUSTER SLOTS reads.
	slots, err := probe.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	var replica string
	for _, sl := range slots {
		if len(sl.Nodes) > 1 {
			replica = sl.Nodes[1].Addr
		}
	}
	cases := map[string]*redis.ClusterOptions{
		"read only, by latency": {Addrs: clusterAddrs(), ReadOnly: true, RouteByLatency: true},
		"randomly":              {Addrs: clusterAddrs(), RouteRandomly: true},
		"a ClusterSlots function": {ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return slots, nil
		}},
	}
	if replica != "" {
		cases["seeded with a replica only"] = &redis.ClusterOptions{Addrs: []string{replica}, ReadOnly: true}
	}
	for name, o := range cases {
		t.Run(name, func(t *testing.T) {
			o.ContextTimeoutEnabled = true
			c := redis.NewClusterClient(o)
			t.Cleanup(func() { _ = c.Close() })
			newStoreOK(t, ctx, c)
		})
	}
	t.Run("NewUniversalClient, Cluster mode", func(t *testing.T) {
		c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: clusterAddrs()[:1], IsClusterMode: true, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		require.IsType(t, &redis.ClusterClient{}, c)
		newStoreOK(t, ctx, c)
	})
}

func TestRedisNewTakesAUniversalClientOfOneRedis(t *testing.T) {
	newClient(t) // skips (or fails) without Redis
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{redisAddr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	require.IsType(t, &redis.Client{}, c)
	newStoreOK(t, ctx, c)
}

func TestRedisNewTakesSentinelClients(t *testing.T) {
	addr, _ := emptyMapRedis(t, false)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "no redis-server binary: "+err.Error())
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	sPort, cmd, exited := redisstore.StartOnPortForTest(t, bin, 0, func(sPort int) []string {
		require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor lr15 127.0.0.1 %s 1\n", sPort, dir, port)), 0o600))
		return []string{conf, "--sentinel"}
	})
	sAddr := fmt.Sprintf("127.0.0.1:%d", sPort)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: sAddr})
	t.Cleanup(func() { _ = sc.Close() })
	require.Eventually(t, func() bool {
		a, err := sc.GetMasterAddrByName(ctx, "lr15").Result()
		return err == nil && len(a) == 2 && a[0]+":"+a[1] == addr
	}, 10*time.Second, 50*time.Millisecond)

	fo := &redis.FailoverOptions{MasterName: "lr15", SentinelAddrs: []string{sAddr}, ContextTimeoutEnabled: true}
	t.Run("NewFailoverClient", func(t *testing.T) {
		c := redis.NewFailoverClient(fo)
		t.Cleanup(func() { _ = c.Close() })
		newStoreOK(t, ctx, c)
	})
	// NewFailoverClusterClient (and NewUniversalClient with MasterName and
	// RouteByLatency or RouteRandomly, which builds one) passes New too (a
	// *redis.ClusterClient whose ClusterSlots function names the Sentinel's
	// primary and replicas), but go-redis v9.23 never closes its Sentinel
	// subscription (Close leaves sentinelFailover.listen running), which
	// TestMain's goleak would report: not run here.
	t.Run("NewUniversalClient, MasterName", func(t *testing.T) {
		c := redis.NewUniversalClient(&redis.UniversalOptions{MasterName: "lr15", Addrs: []string{sAddr}, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		require.IsType(t, &redis.Client{}, c)
		newStoreOK(t, ctx, c)
	})
}

// New refused a nil client with an error, but panicked on a nil
// *redis.Client or *redis.ClusterClient in the interface (reading its
// options): the same mistake, refused the same way.
func TestNewRefusesATypedNilClient(t *testing.T) {
	for _, c := range []redis.UniversalClient{(*redis.Client)(nil), (*redis.ClusterClient)(nil)} {
		var err error
		require.NotPanics(t, func() { _, err = redisstore.New(context.Background(), c) }, "%T", c)
		require.ErrorContains(t, err, "New needs a Redis client")
	}
}

package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// clusterStore returns a store, built with opts, on a Cluster client that
// starts from node a, with hook on the client unless it is nil; both are
// closed at cleanup.
func clusterStore(t *testing.T, ctx context.Context, a *tableNode, hook redis.Hook, opts ...Option) *Store {
	t.Helper()
	return storeOn(t, ctx, redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{a.addr}, ContextTimeoutEnabled: true}), hook, opts...)
}

// storeOn returns a store, built with opts, on client, with hook on the
// client unless it is nil; both are closed at cleanup.
func storeOn(t *testing.T, ctx context.Context, client *redis.ClusterClient, hook redis.Hook, opts ...Option) *Store {
	t.Helper()
	t.Cleanup(func() { _ = client.Close() })
	if hook != nil {
		client.AddHook(hook)
	}
	s, err := New(ctx, client, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// joinedPair starts a Cluster of the test's own on two free ports
// (startTableNode): a serves every slot, and b has joined it, serving none, known to a and
// knowing a's map.
func joinedPair(t *testing.T, ctx context.Context) (a, b *tableNode) {
	t.Helper()
	a, b = startTableNode(t), startTableNode(t)
	ownAllSlots(t, ctx, a)
	require.NoError(t, b.client.ClusterMeet(ctx, "127.0.0.1", a.addr[strings.LastIndexByte(a.addr, ':')+1:]).Err())
	require.True(t, tableEventually(10*time.Second, func() bool {
		return strings.Contains(a.client.ClusterInfo(ctx).Val(), "cluster_known_nodes:2") &&
			strings.Contains(b.client.ClusterInfo(ctx).Val(), "cluster_known_nodes:2") &&
			strings.Contains(b.client.ClusterInfo(ctx).Val(), "cluster_state:ok") &&
			slotsOwner(ctx, b) != ""
	}), "a and b knowing each other")
	return a, b
}

// splitPair starts a Cluster of the test's own on two free ports
// (startTableNode): a serves slots 0-16382 and b slot 16383, as each of them sees it.
func splitPair(t *testing.T, ctx context.Context) (a, b *tableNode) {
	t.Helper()
	a, b = startTableNode(t), startTableNode(t)
	require.NoError(t, a.client.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", 1).Err())
	require.NoError(t, b.client.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", 2).Err())
	require.NoError(t, a.client.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16382).Err())
	require.NoError(t, b.client.Do(ctx, "CLUSTER", "ADDSLOTS", 16383).Err())
	require.NoError(t, b.client.ClusterMeet(ctx, "127.0.0.1", a.addr[strings.LastIndexByte(a.addr, ':')+1:]).Err())
	require.True(t, tableEventually(15*time.Second, func() bool {
		for _, n := range []*tableNode{a, b} {
			//lint:ignore SA1019 go-redis reads the Cluster's map with CLUSTER SLOTS: check what clients read.
			slots, err := n.client.ClusterSlots(ctx).Result()
			if err != nil || len(slots) != 2 || !strings.Contains(n.client.ClusterInfo(ctx).Val(), "cluster_state:ok") {
				return false
			}
		}
		return true
	}), "a and b serving their slots, as each sees it")
	return a, b
}

// startMigrating starts moving slot from a to b: b imports it, a
// migrates it; no key moves yet.
func startMigrating(t *testing.T, ctx context.Context, a, b *tableNode, slot int64) {
	t.Helper()
	require.NoError(t, b.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", a.id).Err())
	require.NoError(t, a.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", b.id).Err())
}

// moveKeys moves to b, with MIGRATE, those of keys that are at a, which
// must be two: the tenant's horizon and the call's record.
func moveKeys(t *testing.T, ctx context.Context, a, b *tableNode, keys []string) {
	t.Helper()
	var present []string
	for _, k := range keys {
		if a.client.Exists(ctx, k).Val() == 1 {
			present = append(present, k)
		}
	}
	require.Len(t, present, 2, "the horizon and the record")
	migrate(t, ctx, a, b, present...)
}

// migrate moves keys from a to b (MIGRATE … KEYS), as a reshard does.
func migrate(t *testing.T, ctx context.Context, a, b *tableNode, keys ...string) {
	t.Helper()
	port := b.addr[strings.LastIndexByte(b.addr, ':')+1:]
	args := []any{"MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	require.NoError(t, a.client.Do(ctx, args...).Err())
}

package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// A call that the Cluster client follows from a MOVED reply reaches another
// node with the first node's run_id; when a passed check vouches for that
// node, the store sends the script once more with its run_id, and the call
// succeeds there (and only there). It runs a Cluster of its own, on ports
// chosen at run time.
func TestRedisStoreResendsAfterMovedToACheckedNode_r16rev(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := splitPair(t, ctx)

	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{a.addr, b.addr}, ContextTimeoutEnabled: true})
	defer func() { _ = client.Close() }()
	const prefix = "r16rev-moved:"
	s, err := New(ctx, client, WithPrefix(prefix))
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	require.Len(t, tableAddrs(s), 2, "New checked both nodes")

	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	hk := s.keys(key)[0]
	slot, err := a.client.ClusterKeySlot(ctx, hk).Result()
	require.NoError(t, err)
	require.NotEqual(t, int64(16383), slot)
	aAddr := routedAddr(t, ctx, client, s, key)

	// The tenant's slot, empty, moves to b; the client's map still names a.
	require.NoError(t, b.client.Do(ctx, "CLUSTER", "BUMPEPOCH").Err())
	for _, n := range []*tableNode{b, a} {
		require.NoError(t, n.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", b.id).Err())
	}
	require.Equal(t, aAddr, routedAddr(t, ctx, client, s, key), "the client read the new map already")

	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: time.Now().Add(5 * time.Second), Minted: true})
	require.NoError(t, err, "the call followed to b, which New checked, failed")
	require.True(t, res.Started)
	require.Equal(t, int64(1), b.client.Exists(ctx, s.keys(key)[1]).Val(), "the record is not on b")
	require.Zero(t, a.client.Exists(ctx, s.keys(key)[1]).Val())
}

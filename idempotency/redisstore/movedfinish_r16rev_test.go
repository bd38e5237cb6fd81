package redisstore

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that a Finish whose slot moved, with its keys, to a node
// whose check no longer vouched for it (no call reached it for a minute)
// failed, although the node was one New checked: go-redis followed the
// MOVED reply there with the first node's run_id, the store had no passed
// check in force for the node's, and the Finish, sent once more, went by
// the client's map, which go-redis reloads in the background, to the first
// node again: the try, whose handler ran, read ABANDONED and its caller got
// UNKNOWN. A Finish sent once more on a Cluster now has the client read the
// map first (and waits for it). It runs a Cluster of its own, on ports
// chosen at run time.
func TestRedisStoreFinishesATryWhoseSlotMoved_r16rev(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := splitPair(t, ctx)

	// The client reads the Cluster's map from b (CLUSTER SLOTS), as slowly
	// as a loaded node may answer once slow is set: go-redis's reload after
	// a MOVED reply, in the background, then comes after the Finish's
	// second send, as it may in production.
	var slow atomic.Bool
	client := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true,
		ClusterSlots: func(ctx context.Context) ([]redis.ClusterSlot, error) {
			if slow.Load() {
				select {
				case <-time.After(300 * time.Millisecond):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			//lint:ignore SA1019 go-redis reads the Cluster's map with CLUSTER SLOTS: give it what a node answers.
			return b.client.ClusterSlots(ctx).Result()
		}})
	defer func() { _ = client.Close() }()
	const recheck = 300 * time.Millisecond
	s, err := New(ctx, client, WithPrefix("r16rev-movedfinish:"), hooks.RedisClockRecheckAfter(recheck).(Option))
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	keys := s.keys(key)
	slot, err := a.client.ClusterKeySlot(ctx, keys[0]).Result()
	require.NoError(t, err)
	require.NotEqual(t, int64(16383), slot)
	aAddr := routedAddr(t, ctx, client, s, key)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: time.Now().Add(20 * time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started)

	// The handler runs; meanwhile the tenant's slot moves, with its keys,
	// to b, and no call reaches b for longer than its check vouches.
	startMigrating(t, ctx, a, b, slot)
	moveKeys(t, ctx, a, b, keys)
	require.NoError(t, b.client.Do(ctx, "CLUSTER", "BUMPEPOCH").Err())
	for _, n := range []*tableNode{b, a} {
		require.NoError(t, n.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", b.id).Err())
	}
	time.Sleep(2 * recheck)
	require.Equal(t, aAddr, routedAddr(t, ctx, client, s, key), "the client read the new map already")

	slow.Store(true)
	err = s.Finish(ctx, idempotency.FinishRequest{Key: key, Try: 1, Minted: true,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("done")})
	require.NoError(t, err, "the handler's outcome was lost")
	st, err := b.client.HGet(ctx, keys[1], "st").Result()
	require.NoError(t, err)
	require.Equal(t, "3", st, "the record on b is not SUCCEEDED")
}

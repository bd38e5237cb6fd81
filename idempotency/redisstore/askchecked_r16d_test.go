package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found the defect this test guards against.
//
// While a Cluster migrates a tenant's slot to a node the map names (it
// serves slots of its own) but whose check no longer vouches for it (no
// call of the store reached it for recheckAfter, a minute by default), a
// key already moved is reached by go-redis following ASK, with the
// source's run_id. A Finish of a try whose handler ran found that Redis
// and was sent again, after pauses, for five seconds, always to the
// source (the slot's owner in the map) and on to the same target, which
// nothing checked: it failed, and the try read ABANDONED, its caller
// UNKNOWN, although the store could check that node at any time. The
// migration never ends in this test. It runs a Cluster of its own, on ports
// chosen at run time.
func TestR16dFinishesATryWhoseKeysMovedToAMappedNodeWhoseCheckLapsed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := splitPair(t, ctx)

	const recheck = time.Second
	s := clusterStore(t, ctx, a, nil, WithPrefix("r16d-ask:"), optionFunc(func(s *Store) { s.recheckAfter = recheck }))
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	keys := s.keys(key)
	slot, err := a.client.ClusterKeySlot(ctx, keys[0]).Result()
	require.NoError(t, err)
	require.NotEqual(t, int64(16383), slot, "the tenant's slot must be a's")
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: time.Now().Add(30 * time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started)

	// The handler runs; meanwhile the tenant's slot starts to migrate to
	// b, its keys are moved already, and b's check (New's) lapses.
	startMigrating(t, ctx, a, b, slot)
	moveKeys(t, ctx, a, b, keys)
	time.Sleep(recheck + recheck/2)

	err = s.Finish(ctx, idempotency.FinishRequest{Key: key, Try: 1, Minted: true,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("done")})
	require.NoError(t, err, "the handler's outcome was lost to the migration")
	// b imports the slot: it answers a read that follows ASK.
	pipe := b.client.Pipeline()
	pipe.Do(ctx, "ASKING")
	get := pipe.HGet(ctx, keys[1], "st")
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	st := get.Val()
	require.Equal(t, "3", st, "the record on b is not SUCCEEDED")
}

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
// While a Cluster migrates a tenant's slot (MIGRATING at its source), a
// script naming keys of which only some are at the source is refused
// TRYAGAIN. Every script named the tenant's index key, which exists only
// under WithMaxRecordsPerTenant: without the bound, every call of a
// tenant whose horizon and record were at the source was refused for as
// long as the migration ran, a Finish included (go-redis resends TRYAGAIN
// a few times, then fails the call), and a try that ran lost its outcome.
// Without the bound, a script names only the keys it uses. The test runs
// its own two-node Cluster, on ports chosen at run time.
func TestR16CallsOfAMigratingSlotRunWhileTheirKeysAreAtTheSource(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := joinedPair(t, ctx)

	s := clusterStore(t, ctx, a, nil)
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: time.Now().Add(20 * time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started)

	// The handler runs; meanwhile the tenant's slot starts to migrate to
	// b, none of its keys moved yet.
	slot, err := a.client.ClusterKeySlot(ctx, s.keys(key)[0]).Result()
	require.NoError(t, err)
	startMigrating(t, ctx, a, b, slot)

	err = s.Finish(ctx, idempotency.FinishRequest{Key: key, Try: 1, Minted: true,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("done")})
	require.NoError(t, err, "the handler's outcome was lost to the migration")
	st, err := a.client.HGet(ctx, s.keys(key)[1], "st").Result()
	require.NoError(t, err)
	require.Equal(t, "3", st, "the record, at the source still, is not SUCCEEDED")
}

package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A Finish resent while its try's keys sit on a node a slot migrates to
// (ASK, a node the map does not name) carries the time it is sent at: once
// the migration ends after the try's lease did, the resend that reaches
// the record, checked, is refused (the record reads ABANDONED), not
// judged by the time of the first send, when the lease still ran. (passes:
// a check of df4bc93.) It runs a Cluster of its own, on ports chosen
// at run time.
func TestR16dAResendAfterTheLeaseEndedIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := joinedPair(t, ctx)

	refused := make(chan struct{}, 16)
	s := clusterStore(t, ctx, a, otherRedisHook{refused}, WithPrefix("r16d-lease:"))
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	keys := s.keys(key)
	deadline := time.Now().Add(time.Second)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: deadline, Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started)
	lease, err := a.client.HGet(ctx, keys[1], "lease").Int64()
	require.NoError(t, err)

	slot, err := a.client.ClusterKeySlot(ctx, keys[0]).Result()
	require.NoError(t, err)
	startMigrating(t, ctx, a, b, slot)
	moveKeys(t, ctx, a, b, keys)

	moved := make(chan error, 1)
	go func() {
		// End the migration once the Finish was refused and the lease
		// ended (by this server's clock, which Redis's follows here).
		select {
		case <-refused:
		case <-ctx.Done():
			moved <- ctx.Err()
			return
		}
		for time.Now().UnixMilli() <= lease+50 {
			time.Sleep(10 * time.Millisecond)
		}
		err := b.client.Do(ctx, "CLUSTER", "BUMPEPOCH").Err()
		for _, n := range []*tableNode{b, a} {
			if err == nil {
				err = n.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", b.id).Err()
			}
		}
		moved <- err
	}()
	err = s.Finish(ctx, idempotency.FinishRequest{Key: key, Try: 1, Minted: true,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("done")})
	require.NoError(t, <-moved)
	require.True(t, errors.Is(err, idempotency.ErrNotRunning), "a Finish past the lease: %v", err)
	st, err := b.client.HGet(ctx, keys[1], "st").Result()
	require.NoError(t, err)
	require.NotEqual(t, "3", st, "the record on b was finished SUCCEEDED past its lease")
}

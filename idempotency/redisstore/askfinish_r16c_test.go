package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found the defect this test guards against.
//
// While a Cluster migrates a tenant's slot to a node that joined it (it
// serves no slot yet: no call of the store reached it, no check vouches
// for it), a key already moved is reached by go-redis following ASK, with
// the source's run_id. A Finish of a try whose handler ran found that
// Redis, had the client read the map (which still names the source) and
// was sent once more, with the source's run_id, to the same target: it
// failed, and the try read ABANDONED, its caller UNKNOWN, although the
// migration ended while the Finish's context still ran. (The test ends
// the migration once the Finish was refused twice.) It runs a Cluster of
// its own, on ports chosen at run time.
func TestR16cFinishesATryWhoseKeysMovedToAnImportingNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := joinedPair(t, ctx)

	refused := make(chan struct{}, 16)
	s := clusterStore(t, ctx, a, otherRedisHook{refused}, WithPrefix("r16c-ask:"))
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	keys := s.keys(key)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: time.Now().Add(20 * time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started)

	// The handler runs; meanwhile the tenant's slot starts to migrate to
	// b, and its keys are moved already.
	slot, err := a.client.ClusterKeySlot(ctx, keys[0]).Result()
	require.NoError(t, err)
	startMigrating(t, ctx, a, b, slot)
	moveKeys(t, ctx, a, b, keys)

	moved := make(chan error, 1)
	go func() {
		for range 2 {
			select {
			case <-refused:
			case <-ctx.Done():
				moved <- ctx.Err()
				return
			}
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
	require.NoError(t, err, "the handler's outcome was lost to the migration")
	require.NoError(t, <-moved)
	st, err := b.client.HGet(ctx, keys[1], "st").Result()
	require.NoError(t, err)
	require.Equal(t, "3", st, "the record on b is not SUCCEEDED")
}

// otherRedisHook signals on refused each reply of a script that found
// another Redis than its node's check read ({15, run_id}).
type otherRedisHook struct{ refused chan struct{} }

func (otherRedisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (otherRedisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h otherRedisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok {
			if v, e := c.Slice(); e == nil && len(v) == 2 && num(v[0]) == kindOtherRedis {
				select {
				case h.refused <- struct{}{}:
				default:
				}
			}
		}
		return err
	}
}

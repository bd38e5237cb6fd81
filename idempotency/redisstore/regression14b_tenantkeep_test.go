package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// A review found that, once Redis kept every record DefaultKeep past its
// expiry, the tenant's index (and so WithMaxRecordsPerTenant's bound)
// counted records only until their expiry: a tenant that filled its bound
// again each time its records expired held up to (1 + DefaultKeep/TTL)
// times the bound in Redis. The index now counts a record until Redis
// removes it: the tenant is refused while its expired records are kept,
// and has room once Redis removed them. Real clock; the keep is shortened
// to 300 ms.
func TestRegression14bRecordsTenantBoundIgnoresKeptRecords(t *testing.T) {
	plain, prefix := newClient(t)
	p := idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
		MaxAttemptDeadline: time.Second, TTL: 1200 * time.Millisecond, MaxResponseBytes: 1024}
	const bound = 2
	const keep = 300 * time.Millisecond
	s := newStore(t, plain, prefix, redisstore.WithPolicy(p), redisstore.WithMaxRecordsPerTenant(bound),
		hooks.RedisKeep(keep).(redisstore.Option))
	ctx := context.Background()
	_, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(0), Call: "0", Method: "/x.Y/Z"})
	require.NoError(t, err) // the tenant's horizon starts
	time.Sleep(2 * p.Skew)

	records := func() int {
		keys, err := plain.Keys(ctx, prefix+"{t:acme}:r|*").Result()
		require.NoError(t, err)
		return len(keys)
	}
	for round := range 3 {
		id := attemptIDNow(0)
		for i := range bound {
			_, err := s.Fence(ctx, idempotency.Key{Tenant: "acme", AttemptID: id, Call: fmt.Sprint(i), Method: "/x.Y/Z"}, 1)
			require.NoError(t, err, "round %d: the tenant has room again once Redis removed its records", round)
		}
		require.LessOrEqual(t, records(), bound, "round %d", round)
		time.Sleep(p.TTL + 100*time.Millisecond) // every record of the round past its expiry, still kept
		_, err := s.Fence(ctx, idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(0), Call: "x", Method: "/x.Y/Z"}, 1)
		require.ErrorIs(t, err, idempotency.ErrStoreFull, "round %d: the kept records still count", round)
		waitFor(t, 10*time.Second, "Redis removing the round's records", func() bool { return records() == 0 })
	}
}

// A review found that New accepted a WithReplicas timeout longer than
// DefaultKeep (with a long ReadTimeout): every Begin whose WAIT took that
// long was then refused as late, and its try ended UNKNOWN for good. New
// now refuses a timeout that leaves less than half the keep.
func TestRegression14bReplicasTimeoutMustLeaveHalfTheKeep(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, ReadTimeout: 2 * time.Minute})
	t.Cleanup(func() { _ = c.Close() })
	_, err := redisstore.New(context.Background(), c, redisstore.WithReplicas(1, 20*time.Second))
	require.ErrorContains(t, err, "DefaultKeep")
}

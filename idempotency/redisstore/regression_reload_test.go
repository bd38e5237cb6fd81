package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// TestRegression10NothingSentReadsNoClusterMap: reloadAfter (redisstore.go) has
// a ClusterClient read the Cluster's map again after "a call failed without
// a reply from Redis", taken as any error that is not a redis.Error. But run
// also fails, with WithReplicas, when the context leaves too little time to
// WAIT (idempotency.TooLittleTimeError): nothing was sent to any node, and
// no node can have died; the map is read again all the same (and so for
// every such Begin: under deadline pressure, one CLUSTER SLOTS after
// another, 200 ms apart). The Cluster's map is served here by
// ClusterOptions.ClusterSlots, which counts the reads, with every slot on
// the test Redis.
func TestRegression10NothingSentReadsNoClusterMap(t *testing.T) {
	_, prefix := newClient(t) // skips without a Redis; deletes prefix's keys
	var reads atomic.Int64
	c := redis.NewClusterClient(&redis.ClusterOptions{
		ContextTimeoutEnabled: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			reads.Add(1)
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: redisAddr()}}}}, nil
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 100*time.Millisecond))
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	clock.Advance(p.Skew)

	// Settle: no reload in flight before the call under test.
	require.Eventually(t, func() bool {
		n := reads.Load()
		time.Sleep(300 * time.Millisecond)
		return reads.Load() == n
	}, 5*time.Second, time.Millisecond)
	before := reads.Load()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond) // < 2 × (Redis's tick + 1 ms)
	defer cancel()
	_, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: clock.Now().Add(5 * time.Second)})
	var tlt *idempotency.TooLittleTimeError
	require.ErrorAs(t, err, &tlt, "nothing is sent with too little time to WAIT")

	require.Never(t, func() bool { return reads.Load() > before }, 500*time.Millisecond, 5*time.Millisecond,
		"a Begin that sent nothing had the Cluster's map read again")
}

package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// reloadAfter's doc says a call that sent nothing reads no Cluster map.
// But a call the store refuses before sending anything — the store was
// closed, or the node is refused after a check found it wrong — failed
// with an error that is no redis.Error, and had go-redis read the
// Cluster's map again: one CLUSTER SLOTS (at most every 200 ms) for calls
// that say nothing of where the slots are.
func TestRefusedCallReadsNoClusterMap(t *testing.T) {
	for _, how := range []string{"found wrong by its check", "the store closed"} {
		t.Run(how, func(t *testing.T) {
			c, reads, prefix := mapCountingCluster(t)
			clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
			p := storetest.Policy()
			s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock),
				hooks.RedisClockRecheckAfter(time.Nanosecond).(redisstore.Option)) // every call checks the node's clock
			key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}

			before := settledReads(t, reads) // no reload in flight before the calls under test

			if how == "the store closed" {
				require.NoError(t, s.Close())
			} else {
				clock.Advance(time.Minute) // Redis's clock now reads a minute behind the server's
			}
			for range 3 {
				_, err := s.Get(context.Background(), key)
				require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "the store refuses the call")
				time.Sleep(250 * time.Millisecond) // past go-redis's reload cooldown
			}
			require.Never(t, func() bool { return reads.Load() > before }, 500*time.Millisecond, 5*time.Millisecond,
				"calls the store refused, sending nothing, had the Cluster's map read again")
		})
	}
}

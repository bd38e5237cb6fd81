package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// shiftClock is the real clock shifted by an offset that a test may change
// after New: the clock of a server as a Redis node that New never saw
// reads it.
type shiftClock struct{ off atomic.Int64 }

func (c *shiftClock) now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// ownClusterNode starts a Cluster-enabled redis-server of the test's own
// (ownRedis), with args added, and returns its address, its Cluster bus
// port and a client of it.
func ownClusterNode(t *testing.T, args ...string) (string, int, *redis.Client) {
	t.Helper()
	bus := freePort(t)
	addr, _ := ownRedis(t, append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-port", fmt.Sprint(bus)}, args...)...)
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return addr, bus, c
}

// A review found that New checked every Cluster node it knew (maxmemory-policy
// noeviction, the clock within the skew, run_id and master_replid in INFO)
// and no node that joined later: a node added to the Cluster after New,
// given a tenant's slot, ran the store's scripts unchecked — one with
// maxmemory-policy allkeys-lru evicts records, one whose clock is behind
// the servers' lets a script move a lost horizon to its call's reading
// rather than Redis's time (so that an attempt created a skew later, whose
// record was lost, reads UNSEEN). Here a one-node Cluster serves the store,
// a second node joins after New and takes the tenant's slot: a call of the
// tenant must fail unavailable, writing nothing, while that node fails a
// check, and work once it passes them (the "sound" case).
func TestRedisClusterNodeJoinedAfterNewIsChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string      // the joining node's
		off  time.Duration // how far the servers' clock is ahead of the joining node's
		want string        // what the error names; "" for none
	}{
		{name: "sound"},
		{name: "allkeys-lru", args: []string{"--maxmemory-policy", "allkeys-lru"}, want: "maxmemory-policy"},
		{name: "clock behind", off: 10 * time.Second, want: "clock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			// Node b joins, and takes the slot of tenant acme (still empty).
			j := joinAfterNew(t, tc.args)

			j.clk.off.Store(int64(tc.off))
			k := j.acmeKey("0")
			for range 2 { // a node that failed its checks is checked again, and fails again
				rec, err := j.store.Get(ctx, k)
				if tc.want == "" {
					require.NoError(t, err)
					require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "the horizon starts now")
					require.Equal(t, int64(1), j.b.Exists(ctx, j.hk).Val(), "the store used b")
					continue
				}
				require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a node that joined after New ran the script unchecked")
				require.ErrorContains(t, err, tc.want)
				require.ErrorContains(t, err, j.bAddr)
				require.Zero(t, j.b.Exists(ctx, j.hk).Val(), "nothing was written on b")
			}
		})
	}
}

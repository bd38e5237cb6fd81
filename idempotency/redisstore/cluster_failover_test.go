package redisstore_test

// A failover inside the test Cluster, made as an operator makes one:
// CLUSTER FAILOVER sent to the replica, which takes over its primary's
// slots with a new replication ID while the old primary becomes its
// replica; then the same back, so that the topology is as
// scripts/ensure-redis-topology.sh left it.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// clusterPair is the test Cluster seen node by node: the primary that has a
// replica, that replica, and a client of every node (the pair included) by
// address, closed at cleanup.
type clusterPair struct {
	primary, replica string
	nodes            map[string]*redis.Client
}

// newNodeClient returns a client of one Cluster node, closed at cleanup. Its
// connections send READONLY, so that it reads the keys of its own slots
// when the node is a replica (which answers MOVED otherwise).
func newNodeClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// findClusterPair finds the Cluster primary with a replica online, and
// skips the test (or fails it under TOLLGATE_REQUIRE_REDIS=1) when there is
// none.
func findClusterPair(t testing.TB) clusterPair {
	t.Helper()
	ctx := context.Background()
	pair := clusterPair{nodes: map[string]*redis.Client{}}
	for _, addr := range clusterAddrs() {
		n := newNodeClient(t, addr)
		pair.nodes[addr] = n
		info, err := n.Info(ctx, "replication").Result()
		if err != nil {
			skipOrFail(t, fmt.Sprintf("the Cluster node %s does not answer (%s): %v", addr, topologyHint, err))
		}
		if r := onlineReplica(info); r != "" && strings.Contains(info, "role:master\r\n") {
			pair.primary, pair.replica = addr, r
		}
	}
	if pair.replica == "" {
		skipOrFail(t, "no primary of the test Cluster has a replica online ("+topologyHint+")")
	}
	pair.nodes[pair.replica] = newNodeClient(t, pair.replica)
	return pair
}

// unsettled returns "" when every node is ok, knows every other one, and
// maps slot to primary with replica beside it (CLUSTER SLOTS, which clients
// read), and replica holds every write primary made; otherwise what is not
// so yet.
func (c clusterPair) unsettled(ctx context.Context, primary, replica string, slot int64) string {
	for addr, n := range c.nodes {
		info, err := n.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER INFO: %v", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok\r\n") ||
			!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r\n", len(c.nodes))) {
			return fmt.Sprintf("%s: CLUSTER INFO %q", addr, info)
		}
		//lint:ignore SA1019 go-redis reads the Cluster's map with CLUSTER SLOTS: check what clients read.
		slots, err := n.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER SLOTS: %v", addr, err)
		}
		if !serves(slots, slot, primary, replica) {
			return fmt.Sprintf("%s: CLUSTER SLOTS %+v", addr, slots)
		}
	}
	if !inSync(ctx, c.nodes[primary], c.nodes[replica]) {
		r, _ := c.nodes[replica].Info(ctx, "replication").Result()
		p, _ := c.nodes[primary].Info(ctx, "replication").Result()
		return fmt.Sprintf("%s not in sync with %s: %q, %q", replica, primary, r, p)
	}
	return ""
}

// serves tells whether slots maps slot to primary, with replica among its
// replicas.
func serves(slots []redis.ClusterSlot, slot int64, primary, replica string) bool {
	for _, r := range slots {
		if int64(r.Start) > slot || slot > int64(r.End) {
			continue
		}
		if len(r.Nodes) == 0 || r.Nodes[0].Addr != primary {
			return false
		}
		for _, n := range r.Nodes[1:] {
			if n.Addr == replica {
				return true
			}
		}
		return false
	}
	return false
}

// role returns the replication role of the node behind n ("master" or
// "slave"), or "" when it does not answer.
func role(ctx context.Context, n *redis.Client) string {
	r, _ := infoField(ctx, n, "replication", "role")
	return r
}

// takeOver has the replica to take over the slots of its primary from, as
// an operator does it (CLUSTER FAILOVER sent to the replica: the two agree
// on the handover, so that no acknowledged write is lost), and waits until
// every node maps slot to it, with from as its replica in sync. It does
// nothing when that is so already.
//
// A replica that took over less than 4 × cluster-node-timeout ago (20 s in
// the test Cluster) does not start another election: it gives the manual
// failover up after 5 s, or Redis 7.0 counts the votes of its previous
// election, takes over for an instant and steps down again (with a lower
// config epoch than its primary's). So takeOver asks again until the
// handover holds, and a test run right after another waits about 20 s.
func (c clusterPair) takeOver(t testing.TB, to, from string, slot int64) {
	t.Helper()
	ctx := context.Background()
	const limit = 90 * time.Second
	deadline := time.Now().Add(limit)
	for asked := 0; ; {
		why := c.unsettled(ctx, to, from, slot)
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not take over slot %d from %s within %v (CLUSTER FAILOVER sent %d times): %s",
				to, slot, from, limit, asked, why)
		}
		if c.unsettled(ctx, from, to, slot) != "" {
			// A handover or a resynchronisation under way.
			eventually(time.Second, func() bool {
				return c.unsettled(ctx, to, from, slot) == "" || c.unsettled(ctx, from, to, slot) == ""
			})
			continue
		}
		n := c.nodes[to]
		if err := n.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil && role(ctx, n) != "master" {
			t.Fatalf("CLUSTER FAILOVER at %s: %v", to, err)
		}
		asked++
		eventually(10*time.Second, func() bool { return c.unsettled(ctx, to, from, slot) == "" })
	}
}

// A failover inside the Cluster: the replica takes over its primary's slots
// with CLUSTER FAILOVER. It holds a copy of every record, and a new
// replication ID, so the horizon moves at once: calls finished or fenced
// before the failover read UNKNOWN and none of their tries starts, although
// their records survived; attempts created after it are vouched for again.
// Each store's client maps the Cluster before the failover, as a running
// server's does. go-redis follows the old primary's MOVED for the store
// that does not wait for replicas; the store that does sends its script
// and WAIT to the primary its client's map names, gets MOVED (the script
// did not run) or, on a client built with ReadOnly, READONLY (the script
// stopped at its first write), answers ErrStoreUnavailable and has the map
// read again, so that its next call reaches the new primary. The old primary takes its
// slots back at cleanup, leaving the Cluster as the test found it; a run
// within 20 s of another waits for Redis to hold the election (takeOver).
func TestRedisClusterFailoverMovesHorizon(t *testing.T) {
	c, prefix := newClusterClient(t)
	pair := findClusterPair(t)
	ctx := context.Background()
	var tenant string
	for i := 0; tenant == "" && i < 1000; i++ {
		if _, addr := primaryOf(t, c, horizonKey(prefix, fmt.Sprintf("tenant-%d", i))); addr == pair.primary {
			tenant = fmt.Sprintf("tenant-%d", i)
		}
	}
	require.NotEmpty(t, tenant, "some tenant lands on %s", pair.primary)
	hk := horizonKey(prefix, tenant)
	slot, _ := primaryOf(t, c, hk)

	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	// Records outlive a takeover that waits for the previous one (above).
	p.TTL = 5 * time.Minute
	waiting := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 2*time.Second))
	c2 := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c2.Close() })
	plain := newStore(t, c2, prefix, redisstore.WithPolicy(p), clockOption(clock))
	// A client that reads from replicas sends READONLY on every connection:
	// on a replica, the script then runs until its first write.
	c3 := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(), ContextTimeoutEnabled: true, ReadOnly: true})
	t.Cleanup(func() { _ = c3.Close() })
	readOnly := newStore(t, c3, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 2*time.Second))
	stores := []struct {
		name   string
		client *redis.ClusterClient
		s      *redisstore.Store
		waits  bool // for replicas: its scripts go to the primary its client's map names
	}{{"WithReplicas", c, waiting, true}, {"plain", c2, plain, false}, {"WithReplicas, ReadOnly client", c3, readOnly, true}}

	done, fenced := finishedAndFenced(t, waiting, clock, p, tenant)
	for _, st := range stores {
		rec, err := st.s.Get(ctx, done)
		require.NoError(t, err, st.name)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState(), st.name)
	}
	// The replica has every write, the finish included.
	primary, replica := pair.nodes[pair.primary], pair.nodes[pair.replica]
	waitFor(t, 10*time.Second, "the replica in sync", func() bool { return inSync(ctx, primary, replica) })
	require.Equal(t, int64(3), replica.Exists(ctx, hk, recordKey(prefix, done), recordKey(prefix, fenced)).Val())

	before := mustInfo(t, replica, "replication", "master_replid")
	require.Equal(t, mustInfo(t, primary, "replication", "master_replid"), before)
	runID := mustInfo(t, replica, "server", "run_id")
	t.Cleanup(func() {
		// Back to the topology the test found, so that it and the other
		// Cluster tests can run again.
		pair.takeOver(t, pair.primary, pair.replica, slot)
	})
	pair.takeOver(t, pair.replica, pair.primary, slot)
	require.Equal(t, "master", mustInfo(t, replica, "replication", "role"))
	require.Equal(t, runID, mustInfo(t, replica, "server", "run_id"), "the replica took over without a restart")
	after := mustInfo(t, replica, "replication", "master_replid")
	require.NotEqual(t, before, after, "a replica that takes over takes a new replication ID")
	for _, st := range stores {
		n, err := st.client.MasterForKey(ctx, hk)
		require.NoError(t, err)
		require.Equal(t, pair.primary, n.Options().Addr, "%s: the client's map still names the old primary", st.name)
	}

	clock.Advance(time.Millisecond)
	for _, st := range stores {
		if !st.waits {
			continue // go-redis follows MOVED to the new primary
		}
		// The first call goes to the old primary, now a replica, and may be
		// answered unavailable; then the client has read the map again, and
		// the calls reach the new primary.
		for stale := 0; ; stale++ {
			res, err := st.s.Begin(ctx, idempotency.BeginRequest{Key: done, Try: 2, Deadline: clock.Now().Add(time.Second)})
			if !errors.Is(err, idempotency.ErrStoreUnavailable) {
				require.NoError(t, err, st.name)
				require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal,
					"%s: try 2 of a call that succeeded before the failover must not start", st.name)
				break
			}
			t.Logf("%s, stale answer %d: %v", st.name, stale, err)
			_, moved := redis.IsMovedError(err)
			require.True(t, moved || redis.IsReadOnlyError(err), "%s: a stale map is the only reason to refuse: %v", st.name, err)
			require.Less(t, stale, 1, "%s answers unavailable after its client read the map again", st.name)
			waitFor(t, 10*time.Second, st.name+": the client reading the Cluster's map again", func() bool {
				n, err := st.client.MasterForKey(ctx, hk)
				return err == nil && n.Options().Addr == pair.replica
			})
		}
	}

	for _, st := range stores {
		for _, k := range []idempotency.Key{done, fenced} {
			rec, err := st.s.Get(ctx, k)
			require.NoError(t, err, "%s, call %s", st.name, k.Call)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(),
				"%s, call %s: its surviving record may be stale", st.name, k.Call)
			for try := uint32(1); try <= 2; try++ {
				res, err := st.s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: try, Deadline: clock.Now().Add(time.Second)})
				require.NoError(t, err, "%s, call %s", st.name, k.Call)
				require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal, "%s, call %s: try %d must not start", st.name, k.Call, try)
			}
			rec, err = st.s.Fence(ctx, k, 2)
			require.NoError(t, err, "%s, call %s", st.name, k.Call)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "%s, call %s", st.name, k.Call)
		}
	}
	// The old records are still there: the horizon alone turned them away.
	require.Equal(t, int64(2), replica.Exists(ctx, recordKey(prefix, done), recordKey(prefix, fenced)).Val())
	id, err := replica.HGet(ctx, hk, "id").Result()
	require.NoError(t, err)
	require.Equal(t, runID+"/"+after, id, "the horizon names the new primary")

	catchUp(clock) // the horizon moved to Redis's time, later than the test clock's
	clock.Advance(p.Skew)
	for i, st := range stores {
		fresh := idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(clock.Now()), Call: fmt.Sprint(2 + 2*i), Method: "/x.Y/Z"}
		rec, err := st.s.Get(ctx, fresh)
		require.NoError(t, err, st.name)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState(), st.name)
		// With WithReplicas(1), the old primary, now the replica, acknowledges.
		res, err := st.s.Begin(ctx, idempotency.BeginRequest{Key: fresh, Try: 1, Deadline: clock.Now().Add(time.Second)})
		require.NoError(t, err, st.name)
		require.True(t, res.Started, st.name)
		require.NoError(t, st.s.Finish(ctx, idempotency.FinishRequest{Key: fresh, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED}))
		fresh.Call = fmt.Sprint(3 + 2*i)
		rec, err = st.s.Fence(ctx, fresh, 1)
		require.NoError(t, err, st.name)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), st.name)
	}
}

// catchUp moves clock to real time when it lags it: a horizon moved after a
// failover or a restart is Redis's own time when that is later
// than the call's reading, and a test clock that stood still while the test
// waited for Redis lags it.
func catchUp(c *storetest.Clock) {
	if d := time.Since(c.Now()); d > 0 {
		c.Advance(d)
	}
}

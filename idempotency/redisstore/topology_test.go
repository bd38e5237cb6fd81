package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// Tests against the Redis topology that scripts/ensure-redis-topology.sh
// starts on loopback: a primary with a live replica
// (TOLLGATE_REDIS_REPLICATED_ADDR) and a Redis Cluster
// (TOLLGATE_REDIS_CLUSTER_ADDRS) whose first primary has a replica and whose
// others have none. Each skips when its Redis does not answer, unless
// TOLLGATE_REQUIRE_REDIS=1.

const topologyHint = "run scripts/ensure-redis-topology.sh"

func replicatedAddr() string {
	if a := os.Getenv("TOLLGATE_REDIS_REPLICATED_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6390"
}

func clusterAddrs() []string {
	if a := os.Getenv("TOLLGATE_REDIS_CLUSTER_ADDRS"); a != "" {
		return strings.Split(a, ",")
	}
	return []string{"127.0.0.1:7301", "127.0.0.1:7302", "127.0.0.1:7303"}
}

// infoField reads one field of INFO section from the Redis behind c.
func infoField(ctx context.Context, c *redis.Client, section, field string) (string, error) {
	s, err := c.Info(ctx, section).Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v, nil
		}
	}
	return "", nil
}

func mustInfo(t testing.TB, c *redis.Client, section, field string) string {
	t.Helper()
	v, err := infoField(context.Background(), c, section, field)
	require.NoError(t, err)
	return v
}

// waitFor polls cond until it holds, failing the test when it does not
// within limit: the state of another process, not a timed assertion.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	if !eventually(limit, cond) {
		t.Fatalf("%s: not within %v", what, limit)
	}
}

// eventually polls cond until it holds, and tells whether it did within
// limit.
func eventually(limit time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
	return true
}

// inSync tells whether replica replicates primary with every write primary
// had made when asked.
func inSync(ctx context.Context, primary, replica *redis.Client) bool {
	off, err := infoField(ctx, primary, "replication", "master_repl_offset")
	if err != nil {
		return false
	}
	want, _ := strconv.ParseInt(off, 10, 64)
	r, err := replica.Info(ctx, "replication").Result()
	if err != nil {
		return false
	}
	f := map[string]string{}
	for line := range strings.SplitSeq(r, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			f[k] = v
		}
	}
	got, _ := strconv.ParseInt(f["slave_repl_offset"], 10, 64)
	_, port, _ := net.SplitHostPort(primary.Options().Addr)
	return f["role"] == "slave" && f["master_port"] == port && f["master_link_status"] == "up" &&
		f["master_sync_in_progress"] == "0" && got >= want
}

// onlineReplica returns the address of the first replica that a primary's
// INFO replication lists as online, or "".
func onlineReplica(info string) string {
	for line := range strings.SplitSeq(info, "\r\n") {
		if !strings.HasPrefix(line, "slave0:") {
			continue
		}
		f := map[string]string{}
		for kv := range strings.SplitSeq(strings.TrimPrefix(line, "slave0:"), ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				f[k] = v
			}
		}
		if f["state"] == "online" {
			return net.JoinHostPort(f["ip"], f["port"])
		}
	}
	return ""
}

// newReplicatedClients returns clients of the replicated pair's primary and
// of its replica (found in the primary's INFO), closed at cleanup, and a
// fresh key prefix whose keys are deleted at cleanup.
func newReplicatedClients(t testing.TB) (primary, replica *redis.Client, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr := replicatedAddr()
	primary = redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	if err := primary.Ping(ctx).Err(); err != nil {
		_ = primary.Close()
		skipOrFail(t, fmt.Sprintf("no Redis answers at %s (set TOLLGATE_REDIS_REPLICATED_ADDR, or %s): %v", addr, topologyHint, err))
	}
	info, err := primary.Info(ctx, "replication").Result()
	require.NoError(t, err)
	replicaAddr := onlineReplica(info)
	if !strings.Contains(info, "role:master") || replicaAddr == "" {
		_ = primary.Close()
		skipOrFail(t, fmt.Sprintf("the Redis at %s is not a primary with a replica online (%s)", addr, topologyHint))
	}
	replica = redis.NewClient(&redis.Options{Addr: replicaAddr, ContextTimeoutEnabled: true})
	prefix = "tollgate-test:" + randomHex() + ":"
	t.Cleanup(func() {
		deletePrefix(t, primary, prefix)
		_ = replica.Close()
		_ = primary.Close()
	})
	return primary, replica, prefix
}

// newClusterClient returns a client of the test Cluster, closed at cleanup,
// and a fresh key prefix whose keys are deleted from every primary at
// cleanup.
func newClusterClient(t testing.TB) (*redis.ClusterClient, string) {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(), ContextTimeoutEnabled: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err == nil && !strings.Contains(info, "cluster_state:ok") {
		err = fmt.Errorf("the Cluster is not ok: %q", info)
	}
	if err != nil {
		_ = c.Close()
		skipOrFail(t, fmt.Sprintf("no Redis Cluster answers at %s (set TOLLGATE_REDIS_CLUSTER_ADDRS, or %s): %v",
			strings.Join(clusterAddrs(), ","), topologyHint, err))
	}
	prefix := "tollgate-test:" + randomHex() + ":"
	t.Cleanup(func() {
		deleteClusterPrefix(t, c, prefix)
		_ = c.Close()
	})
	return c, prefix
}

func deleteClusterPrefix(t testing.TB, c *redis.ClusterClient, prefix string) {
	require.NoError(t, c.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		return deleteKeys(ctx, node, prefix)
	}))
}

func horizonKey(prefix, tenant string) string { return prefix + "{t:" + tenant + "}:h" }

func recordKey(prefix string, k idempotency.Key) string {
	return prefix + "{t:" + k.Tenant + "}:r|" + k.AttemptID + "|" + k.Call + "|" + k.Method
}

// primaryOf returns the slot of key, as the Cluster computes it, and the
// address of the primary that serves it.
func primaryOf(t testing.TB, c *redis.ClusterClient, key string) (int64, string) {
	t.Helper()
	ctx := context.Background()
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	require.NoError(t, err)
	shards, err := c.ClusterShards(ctx).Result()
	require.NoError(t, err)
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= slot && slot <= r.End {
				for _, n := range sh.Nodes {
					if n.Role == "master" {
						return slot, net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
					}
				}
			}
		}
	}
	t.Fatalf("no primary serves slot %d", slot)
	return 0, ""
}

// primaries returns a client of each of the Cluster's primaries by address;
// the Cluster client owns them.
func primaries(t testing.TB, c *redis.ClusterClient) map[string]*redis.Client {
	t.Helper()
	var mu sync.Mutex
	nodes := map[string]*redis.Client{}
	require.NoError(t, c.ForEachMaster(context.Background(), func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes[n.Options().Addr] = n
		return nil
	}))
	return nodes
}

// The conformance suite against a store on a Redis Cluster: every script
// touches a tenant's horizon key and one record key, which the hash tag
// keeps in one slot.
func TestRedisClusterConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock, p idempotency.Policy) storetest.Harness {
		c, prefix := newClusterClient(t)
		s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
		return storetest.Harness{Store: s, Lose: func(t *testing.T) { deleteClusterPrefix(t, c, prefix) }}
	})
}

// Tenants spread over the Cluster's primaries. For a tenant on each primary,
// the store works, its horizon and record share a slot, and the record lives
// on the primary that owns the slot and on no other. The Cluster refuses a
// script over keys of two tenants (two slots): only the hash tag lets the
// store's scripts run.
func TestRedisClusterTenantsSpreadOverNodes(t *testing.T) {
	c, prefix := newClusterClient(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	nodes := primaries(t, c)
	require.GreaterOrEqual(t, len(nodes), 3, "the test Cluster has at least 3 primaries")

	tenantOn := map[string]string{} // primary address → a tenant whose slot it owns
	for i := 0; len(tenantOn) < len(nodes) && i < 1000; i++ {
		tenant := fmt.Sprintf("tenant-%d", i)
		_, primary := primaryOf(t, c, horizonKey(prefix, tenant))
		if _, ok := tenantOn[primary]; !ok {
			tenantOn[primary] = tenant
		}
	}
	require.Len(t, tenantOn, len(nodes), "some tenant lands on each primary")
	for _, tenant := range tenantOn {
		_, err := s.Get(ctx, idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"})
		require.NoError(t, err) // the tenant's horizon starts
	}
	clock.Advance(p.Skew)

	keys := map[string]idempotency.Key{}
	for addr, tenant := range tenantOn {
		k := idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
		keys[tenant] = k
		hk, rk := horizonKey(prefix, tenant), recordKey(prefix, k)
		hSlot, primary := primaryOf(t, c, hk)
		rSlot, _ := primaryOf(t, c, rk)
		require.Equal(t, hSlot, rSlot, "tenant %s: horizon and record share a slot", tenant)
		require.Equal(t, addr, primary)

		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
		require.NoError(t, err)
		require.True(t, res.Started, "tenant %s on %s: %v", tenant, addr, res.Refusal)
		require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
			State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte(tenant)}))

		for other, n := range nodes {
			// Other tests (and earlier runs) may keep keys of the same
			// tenant, so of the same slot, under other prefixes: count
			// this test's own.
			inSlot, err := n.ClusterGetKeysInSlot(ctx, int(hSlot), 10000).Result()
			require.NoError(t, err)
			count := int64(0)
			for _, key := range inSlot {
				if strings.HasPrefix(key, prefix) {
					count++
				}
			}
			if other == addr {
				require.Equal(t, int64(2), count, "the primary %s holds tenant %s's horizon and record", addr, tenant)
				require.Equal(t, int64(2), n.Exists(ctx, hk, rk).Val())
			} else {
				require.Zero(t, count, "the primary %s holds none of tenant %s's keys", other, tenant)
			}
		}
	}
	// Each tenant reads its own record, whichever node serves it.
	for tenant, k := range keys {
		rec, err := s.Get(ctx, k)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
		require.Equal(t, tenant, string(rec.GetResponse()))
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
		require.NoError(t, err)
		require.Equal(t, idempotency.RefusedFinished, res.Refusal)
	}

	var two []string
	for _, tenant := range tenantOn {
		two = append(two, horizonKey(prefix, tenant))
	}
	err := c.Eval(ctx, `return redis.call('EXISTS', KEYS[1]) + redis.call('EXISTS', KEYS[2])`, two[:2]).Err()
	require.ErrorContains(t, err, "CROSSSLOT", "a script over two tenants' keys")
}

// WAIT counts the replicas that hold the writes of the connection it is
// sent on, so the store must send it to the primary that ran the script.
// In the test Cluster the first primary has a replica and the others have
// none: a tenant on the first is acknowledged, a tenant on another is not.
// Several calls per tenant, since a Cluster client spreads commands without
// keys over the primaries.
func TestRedisClusterWaitForReplicas(t *testing.T) {
	c, prefix := newClusterClient(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	ctx := context.Background()
	nodes := primaries(t, c)
	var with, without []string // tenants on a primary with a replica attached, and on one without
	for i := 0; (len(with) < 2 || len(without) < 2) && i < 1000; i++ {
		tenant := fmt.Sprintf("tenant-%d", i)
		_, primary := primaryOf(t, c, horizonKey(prefix, tenant))
		// What WAIT counts: the replicas attached to the primary.
		switch mustInfo(t, nodes[primary], "replication", "connected_slaves") {
		case "0":
			if len(without) < 2 {
				without = append(without, tenant)
			}
		default:
			if len(with) < 2 {
				with = append(with, tenant)
			}
		}
	}
	if len(with) == 0 || len(without) == 0 {
		skipOrFail(t, "the test Cluster needs a primary with a replica and one without ("+topologyHint+")")
	}
	// A replica acknowledges within a round trip; the long timeout is a bound.
	acked := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 2*time.Second))
	// No replica can acknowledge: the time WAIT waits in vain is all this sets.
	short := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 20*time.Millisecond))
	plain := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	for _, tenant := range append(append([]string{}, with...), without...) {
		_, err := plain.Get(ctx, idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"})
		require.NoError(t, err)
	}
	clock.Advance(p.Skew)
	id := storetest.AttemptIDAt(clock.Now())
	for round := range 3 {
		for _, tenant := range with {
			k := idempotency.Key{Tenant: tenant, AttemptID: id, Call: fmt.Sprint(round), Method: "/x.Y/Z"}
			res, err := acked.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
			require.NoError(t, err, "tenant %s, whose primary has a replica", tenant)
			require.True(t, res.Started)
			k.Call += ".f"
			rec, err := acked.Fence(ctx, k, 1)
			require.NoError(t, err, "tenant %s, whose primary has a replica", tenant)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
		}
		for _, tenant := range without {
			k := idempotency.Key{Tenant: tenant, AttemptID: id, Call: fmt.Sprint(round), Method: "/x.Y/Z"}
			_, err := short.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "tenant %s, whose primary has no replica", tenant)
			require.ErrorContains(t, err, "0 of 1 replicas")
			rec, err := plain.Get(ctx, k)
			require.NoError(t, err)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the try that fell short is fenced")
			k.Call += ".f"
			_, err = short.Fence(ctx, k, 1)
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "tenant %s, whose primary has no replica", tenant)
		}
	}
}

// New checks maxmemory-policy on every node of a Cluster, replicas
// included (a replica becomes a primary in a failover), not on whichever
// node a command without keys reaches.
func TestRedisClusterNewChecksEveryNode(t *testing.T) {
	c, _ := newClusterClient(t)
	ctx := context.Background()
	var mu sync.Mutex
	var addrs []string
	require.NoError(t, c.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		addrs = append(addrs, n.Options().Addr)
		return nil
	}))
	for _, addr := range addrs {
		t.Run(addr, func(t *testing.T) {
			n := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
			defer n.Close()
			require.NoError(t, n.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
			defer func() { require.NoError(t, n.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err()) }()
			for range len(addrs) { // every node in turn may answer a command without keys
				_, err := redisstore.New(ctx, c)
				require.ErrorContains(t, err, "noeviction")
				require.ErrorContains(t, err, addr)
			}
		})
	}
	_, err := redisstore.New(ctx, c)
	require.NoError(t, err)
}

// With a live replica, WithReplicas(1) Begin and Fence answer, and when they
// do the replica already holds what they wrote (TestRedisWaitForReplicas is
// the contrast: the lone Redis has no replica and they are refused).
func TestRedisReplicatedWaitForReplicas(t *testing.T) {
	primary, replica, prefix := newReplicatedClients(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, primary, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 2*time.Second))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: startHorizon(t, s, clock, "acme"), Call: "0", Method: "/x.Y/Z"}
	state := func(key, field string) string {
		v, err := replica.HGet(ctx, key, field).Result()
		require.NoError(t, err, "the replica holds %s", key)
		return v
	}

	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.Equal(t, fmt.Sprint(int(tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS)), state(recordKey(prefix, k), "st"))
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED}))
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedFinished, res.Refusal)

	k2 := k
	k2.Call = "1"
	rec, err := s.Fence(ctx, k2, 1)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	require.Equal(t, fmt.Sprint(int(tollgatev1.AttemptState_ATTEMPT_STATE_FENCED)), state(recordKey(prefix, k2), "st"))
	require.Equal(t, "1", state(recordKey(prefix, k2), "fen"))
}

// A failover: the replica, holding a copy of every record, is promoted.
// Its other identity moves the horizon at once, so the earlier attempts
// read UNKNOWN and none of their tries starts, although their records
// survived; attempts created after the failover are vouched for again.
// The replica is made a replica of the primary again at the end.
func TestRedisFailoverMovesHorizon(t *testing.T) {
	primary, replica, prefix := newReplicatedClients(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, primary, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 2*time.Second))
	ctx := context.Background()
	tenant := "acme"
	done, fenced := finishedAndFenced(t, s, clock, p, tenant)
	// The replica has every write, the finish included.
	waitFor(t, 10*time.Second, "the replica in sync", func() bool { return inSync(ctx, primary, replica) })
	require.Equal(t, int64(3), replica.Exists(ctx, horizonKey(prefix, tenant), recordKey(prefix, done), recordKey(prefix, fenced)).Val())

	_, primaryPort, err := net.SplitHostPort(primary.Options().Addr)
	require.NoError(t, err)
	primaryHost, _, _ := net.SplitHostPort(primary.Options().Addr)
	t.Cleanup(func() {
		// Back to the topology the test found, so that it can run again.
		require.NoError(t, replica.Do(ctx, "REPLICAOF", primaryHost, primaryPort).Err())
		waitFor(t, 30*time.Second, "the replica back in sync with the primary", func() bool { return inSync(ctx, primary, replica) })
	})
	before := mustInfo(t, replica, "replication", "master_replid")
	require.Equal(t, mustInfo(t, primary, "replication", "master_replid"), before)
	require.NoError(t, replica.Do(ctx, "REPLICAOF", "NO", "ONE").Err())
	require.Equal(t, "master", mustInfo(t, replica, "replication", "role"))
	require.NotEqual(t, before, mustInfo(t, replica, "replication", "master_replid"), "a promoted replica takes a new replication ID")

	promoted := newStore(t, replica, prefix, redisstore.WithPolicy(p), clockOption(clock))
	clock.Advance(time.Millisecond)
	for _, k := range []idempotency.Key{done, fenced} {
		rec, err := promoted.Get(ctx, k)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "call %s: its surviving record may be stale", k.Call)
		res, err := promoted.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
		require.NoError(t, err)
		require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal, "call %s: try 2 must not start", k.Call)
		rec, err = promoted.Fence(ctx, k, 2)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())
	}
	// The old record is still there: the horizon alone turned it away.
	require.Equal(t, int64(1), replica.Exists(ctx, recordKey(prefix, done)).Val())

	clock.Advance(p.Skew)
	fresh := idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	rec, err := promoted.Get(ctx, fresh)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())
	res, err := promoted.Begin(ctx, idempotency.BeginRequest{Key: fresh, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
}

// finishedAndFenced starts tenant's horizon in s, then writes two calls of
// one attempt inside it: one begun and finished SUCCEEDED (done), one fenced
// through try 1 (fenced).
func finishedAndFenced(t *testing.T, s *redisstore.Store, clock *storetest.Clock, p idempotency.Policy, tenant string) (done, fenced idempotency.Key) {
	t.Helper()
	ctx := context.Background()
	done = idempotency.Key{Tenant: tenant, AttemptID: startHorizon(t, s, clock, tenant), Call: "0", Method: "/x.Y/Z"}
	fenced = done
	fenced.Call = "1"
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: done, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: done, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")}))
	rec, err := s.Fence(ctx, fenced, 1)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	return done, fenced
}

// TestNothingSentReadsNoClusterMap: reloadAfter (redisstore.go) has
// a ClusterClient read the Cluster's map again after "a call failed without
// a reply from Redis", taken as any error that is not a redis.Error. But run
// also fails, with WithReplicas, when the context leaves too little time to
// WAIT (idempotency.TooLittleTimeError): nothing was sent to any node, and
// no node can have died; the map is read again all the same (and so for
// every such Begin: under deadline pressure, one CLUSTER SLOTS after
// another, 200 ms apart). The Cluster's map is served here by
// ClusterOptions.ClusterSlots, which counts the reads, with every slot on
// the test Redis.
func TestNothingSentReadsNoClusterMap(t *testing.T) {
	c, reads, prefix := mapCountingCluster(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 100*time.Millisecond))
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	clock.Advance(p.Skew)
	before := settledReads(t, reads) // no reload in flight before the call under test

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond) // < 2 × (Redis's tick + 1 ms)
	defer cancel()
	_, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: clock.Now().Add(5 * time.Second)})
	var tlt *idempotency.TooLittleTimeError
	require.ErrorAs(t, err, &tlt, "nothing is sent with too little time to WAIT")

	require.Never(t, func() bool { return reads.Load() > before }, 500*time.Millisecond, 5*time.Millisecond,
		"a Begin that sent nothing had the Cluster's map read again")
}

// mapCountingCluster returns a Cluster client whose map (every slot on the
// test Redis) is served by ClusterOptions.ClusterSlots, which counts its
// reads in reads, and a key prefix of the test's own. It skips the test
// without a Redis.
func mapCountingCluster(t *testing.T) (c *redis.ClusterClient, reads *atomic.Int64, prefix string) {
	t.Helper()
	_, prefix = newClient(t) // skips without a Redis; deletes prefix's keys
	reads = new(atomic.Int64)
	c = redis.NewClusterClient(&redis.ClusterOptions{
		ContextTimeoutEnabled: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			reads.Add(1)
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: redisAddr()}}}}, nil
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	return c, reads, prefix
}

// settledReads waits until no map read is in flight (none for 300 ms) and
// returns the count of reads then.
func settledReads(t *testing.T, reads *atomic.Int64) int64 {
	t.Helper()
	require.Eventually(t, func() bool {
		n := reads.Load()
		time.Sleep(300 * time.Millisecond)
		return reads.Load() == n
	}, 5*time.Second, time.Millisecond)
	return reads.Load()
}

// A review asked whether it matters that Get sends no WAIT with
// WithReplicas, although it writes the horizon key of a tenant that has
// none. It does not change what any call answers after a failover: the
// promoted replica has another identity (its run_id and a new
// master_replid), so every horizon key, copied or not, is another Redis's,
// and the first script of each tenant moves its horizon. A horizon key
// lost with the primary reads as a missing one and moves it the same way.
// Get's answer itself is a reading of one Redis at one moment (GetAttempt
// is for operators and tools); an owner's decision goes through
// FenceAttempt, whose Fence waits. Here, on servers of the test's own, the
// replica is cut off while Get starts the horizon of tenant "lone", the
// primary dies, and the replica, promoted, lacks that key: "lone"'s
// attempt reads UNKNOWN and no try of it starts, exactly as the attempts of
// tenant "acme", whose horizon and records the replica acknowledged.
func TestRedisGetHorizonLostInFailover(t *testing.T) {
	paddr, pproc := ownRedis(t)
	raddr, _ := ownRedis(t)
	primary := redis.NewClient(&redis.Options{Addr: paddr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = primary.Close() })
	replica := redis.NewClient(&redis.Options{Addr: raddr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = replica.Close() })
	ctx := context.Background()
	host, port, err := net.SplitHostPort(paddr)
	require.NoError(t, err)
	require.NoError(t, primary.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err()) // a server of this test's own
	require.NoError(t, replica.Do(ctx, "REPLICAOF", host, port).Err())
	waitFor(t, 10*time.Second, "the replica in sync, and online for the primary", func() bool {
		return inSync(ctx, primary, replica) && onlineReplica(primary.Info(ctx, "replication").Val()) != ""
	})

	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	const prefix = "getwait:"
	s := newStore(t, primary, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, time.Second))
	done, fenced := finishedAndFenced(t, s, clock, p, "acme")
	waitFor(t, 10*time.Second, "the replica in sync", func() bool { return inSync(ctx, primary, replica) })

	// The replica is cut off (it turns to a master that does not answer,
	// keeping its data), as a partition would.
	require.NoError(t, replica.Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err())
	waitFor(t, 10*time.Second, "the primary without its replica", func() bool {
		return mustInfo(t, primary, "replication", "connected_slaves") == "0"
	})
	lone := idempotency.Key{Tenant: "lone", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	rec, err := s.Get(ctx, lone) // starts "lone"'s horizon, on the primary only
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())
	require.Equal(t, int64(1), primary.Exists(ctx, horizonKey(prefix, "lone")).Val())
	require.NoError(t, pproc.Process.Kill())
	_ = pproc.Wait()
	require.NoError(t, replica.Do(ctx, "REPLICAOF", "NO", "ONE").Err())
	require.Zero(t, replica.Exists(ctx, horizonKey(prefix, "lone")).Val(), "Get's horizon write was lost with the primary")
	require.Equal(t, int64(1), replica.Exists(ctx, horizonKey(prefix, "acme")).Val())

	promoted := newStore(t, replica, prefix, redisstore.WithPolicy(p), clockOption(clock))
	clock.Advance(time.Millisecond)
	for _, k := range []idempotency.Key{lone, done, fenced} {
		rec, err := promoted.Get(ctx, k)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "tenant %s, call %s", k.Tenant, k.Call)
		res, err := promoted.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
		require.NoError(t, err)
		require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal, "tenant %s, call %s: try 2 must not start", k.Tenant, k.Call)
	}
}

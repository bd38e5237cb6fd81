package redisstore_test

// A Cluster primary that crashes. The test starts a Redis Cluster of its
// own (three primaries, and one replica of the primary that owns the test
// tenant's slot) from redis-server processes on free loopback ports, each
// in its own temporary directory, and kills them all at cleanup; it does
// not touch the topology of scripts/ensure-redis-topology.sh.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// crashNodeTimeout is the own Cluster's cluster-node-timeout: a primary
// that does not answer for that long is suspected, and its replica takes
// over about a second later.
const crashNodeTimeout = time.Second

// ownNode is one redis-server process of an ownCluster.
type ownNode struct {
	addr    string
	port    int
	busPort int
	dir     string
	cmd     *exec.Cmd
	client  *redis.Client
	id      string // CLUSTER MYID
}

// ownCluster is a Redis Cluster the test started: primaries and one
// replica, of the primary that owns slot.
type ownCluster struct {
	primaries []*ownNode
	replica   *ownNode
	owner     *ownNode // the primary of slot, which replica replicates
	slot      int64
	probe     string // a key in slot, for checking that WAIT counts a replica
}

func (c *ownCluster) nodes() []*ownNode {
	return append(append([]*ownNode{}, c.primaries...), c.replica)
}

func (c *ownCluster) primaryAddrs() []string {
	var addrs []string
	for _, n := range c.primaries {
		addrs = append(addrs, n.addr)
	}
	return addrs
}

// freePorts returns n distinct loopback ports that were free when asked,
// none of those the shared test topology uses nor any other test of this
// process got (redisstore.OwnPortForTest).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ports = append(ports, redisstore.OwnPortForTest(t))
	}
	return ports
}

// startNode starts redis-server in cluster mode on port (its Cluster bus on
// busPort) with its own directory, and waits until it answers. The process
// is killed at cleanup, if the test has not killed it.
func startNode(t *testing.T, port, busPort int, dir string) *ownNode {
	t.Helper()
	n := &ownNode{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), port: port, busPort: busPort, dir: dir}
	n.cmd = exec.Command("redis-server",
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir, "--logfile", "redis.log",
		"--daemonize", "no", "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
		"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(busPort), "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(crashNodeTimeout.Milliseconds(), 10),
		"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1",
		// A WAIT that falls short answers on the tick after its timeout.
		"--hz", "100")
	n.cmd.Dir = dir
	require.NoError(t, n.cmd.Start())
	t.Cleanup(func() { n.kill() })
	n.client = redis.NewClient(&redis.Options{Addr: n.addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = n.client.Close() })
	ping := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return n.client.Ping(ctx).Err() == nil
	}
	waitFor(t, 10*time.Second, "redis-server answering at "+n.addr+" (see "+filepath.Join(dir, "redis.log")+")", ping)
	return n
}

// kill sends SIGKILL to the node's process and reaps it; it does nothing
// when the process has ended already.
func (n *ownNode) kill() {
	if n.cmd.ProcessState != nil {
		return
	}
	_ = n.cmd.Process.Kill()
	_ = n.cmd.Wait()
}

func (n *ownNode) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, n.cmd.Process.Signal(sig), "signal %v to %s", sig, n.addr)
}

// startOwnCluster starts a Redis Cluster of three primaries, which share
// the slots, and one replica of the primary that owns the slot of the hash
// tag tag (such as "{t:acme}"). It skips the test (or fails it under
// TOLLGATE_REQUIRE_REDIS=1) when redis-server is not installed.
func startOwnCluster(t *testing.T, tag string) *ownCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		skipOrFail(t, "redis-server is not on PATH, so the test cannot start a Redis Cluster of its own: "+err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const primaries = 3
	ports := freePorts(t, 2*(primaries+1))
	root := t.TempDir()
	c := &ownCluster{}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, n := range c.nodes() {
			if n == nil {
				continue
			}
			if log, err := os.ReadFile(filepath.Join(n.dir, "redis.log")); err == nil {
				lines := strings.Split(strings.TrimSpace(string(log)), "\n")
				t.Logf("redis.log of %s (last lines):\n%s", n.addr, strings.Join(lines[max(0, len(lines)-60):], "\n"))
			}
		}
	})
	var all []*ownNode
	for i := range primaries + 1 {
		dir := filepath.Join(root, fmt.Sprint(i))
		require.NoError(t, os.Mkdir(dir, 0o755))
		n := startNode(t, ports[2*i], ports[2*i+1], dir)
		n.id = n.client.ClusterMyID(ctx).Val()
		require.NotEmpty(t, n.id, "CLUSTER MYID at %s", n.addr)
		all = append(all, n)
	}
	c.primaries, c.replica = all[:primaries], all[primaries]

	var err error
	c.slot, err = all[0].client.ClusterKeySlot(ctx, tag).Result()
	require.NoError(t, err)
	c.probe = "tollgate-test-probe:" + tag
	for i, n := range all {
		// Distinct config epochs, as redis-cli --cluster create sets them.
		require.NoError(t, n.client.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err())
	}
	for i, n := range c.primaries {
		lo, hi := i*16384/primaries, (i+1)*16384/primaries-1
		require.NoError(t, n.client.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err())
		if int64(lo) <= c.slot && c.slot <= int64(hi) {
			c.owner = n
		}
	}
	for _, n := range all[1:] {
		// The bus port is not the default port + 10000: MEET names it.
		require.NoError(t, n.client.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", all[0].port, all[0].busPort).Err())
	}
	waitFor(t, 10*time.Second, "every node knowing every other", func() bool {
		for _, n := range all {
			if v, _ := clusterInfoField(ctx, n.client, "cluster_known_nodes"); v != fmt.Sprint(len(all)) {
				return false
			}
		}
		return true
	})
	require.NoError(t, c.replica.client.Do(ctx, "CLUSTER", "REPLICATE", c.owner.id).Err())
	waitFor(t, 15*time.Second, "the Cluster ok, the replica in sync", func() bool {
		for _, n := range all {
			if v, _ := clusterInfoField(ctx, n.client, "cluster_state"); v != "ok" {
				return false
			}
		}
		return c.replicaAcks(ctx, c.owner, c.replica)
	})
	return c
}

// replicaAcks tells whether replica is in sync with primary and WAIT,
// sent after a write to primary, counts it. (After a diskless sync a
// primary may list a replica online before it streams writes to it, until
// the replica's next acknowledgement, up to a second later.)
func (c *ownCluster) replicaAcks(ctx context.Context, primary, replica *ownNode) bool {
	if !inSync(ctx, primary.client, replica.client) {
		return false
	}
	pipe := primary.client.Pipeline()
	pipe.Set(ctx, c.probe, replica.addr, 0)
	acked := pipe.Do(ctx, "WAIT", 1, 50)
	_, _ = pipe.Exec(ctx)
	n, err := acked.Int()
	return err == nil && n >= 1
}

// clusterInfoField reads one field of CLUSTER INFO from the node behind n.
func clusterInfoField(ctx context.Context, n *redis.Client, field string) (string, error) {
	s, err := n.ClusterInfo(ctx).Result()
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

// callTimeout bounds each store call made while the tenant's primary is
// down or just replaced.
const callTimeout = 500 * time.Millisecond

// callSlack is what a call may take beyond its context: a Begin that fails
// after sending its script waits for its own fence (100 ms, the store's
// failedBeginFenceTimeout), and the machine may be busy.
const callSlack = 600 * time.Millisecond

// crashCall is one store call made around the crash, and what it answered.
type crashCall struct {
	what    string
	err     error
	started bool                    // Begin: the try started
	refusal idempotency.Refusal     // Begin
	state   tollgatev1.AttemptState // Get, Fence, and a Begin's record
	elapsed time.Duration
}

// crashRound asks s, at once and on contexts bounded by callTimeout, about
// the calls of the attempt created before the crash: a second try of the
// call whose record is gone and of one whose record survived, a lookup and
// a fence of the one that is gone, and the finish of the try that was
// running when the primary died. It returns when every call has answered.
func crashRound(s *redisstore.Store, clock *storetest.Clock, lost, kept, running idempotency.Key) []crashCall {
	calls := []crashCall{
		{what: "Begin try 2 of call " + lost.Call},
		{what: "Begin try 2 of call " + kept.Call},
		{what: "Get of call " + lost.Call},
		{what: "Fence through 2 of call " + lost.Call},
		{what: "Finish try 1 of call " + running.Call},
	}
	ask := func(ctx context.Context, i int) {
		c := &calls[i]
		switch i {
		case 0, 1:
			k := []idempotency.Key{lost, kept}[i]
			res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
			c.err, c.started, c.refusal, c.state = err, res.Started, res.Refusal, res.Record.GetState()
		case 2:
			rec, err := s.Get(ctx, lost)
			c.err, c.state = err, rec.GetState()
		case 3:
			rec, err := s.Fence(ctx, lost, 2)
			c.err, c.state = err, rec.GetState()
		case 4:
			c.err = s.Finish(ctx, idempotency.FinishRequest{Key: running, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED})
		}
	}
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			start := time.Now()
			ask(ctx, i)
			calls[i].elapsed = time.Since(start)
		})
	}
	wg.Wait()
	return calls
}

// requireHonest fails t unless c is an answer DESIGN.md §3.8 allows for an
// attempt created before the primary of its slot crashed: the store
// unavailable (always allowed; the only answer while no primary serves the
// slot), or, once the replica took over, the horizon's answer — UNKNOWN,
// ATTEMPT_UNVERIFIABLE, a finish refused — and never UNSEEN, a fence of an
// absent record, or a try begun as if new.
func requireHonest(t *testing.T, store string, c crashCall, outage bool) {
	t.Helper()
	require.Less(t, c.elapsed, callTimeout+callSlack, "%s, %s: answered late (%v)", store, c.what, c.err)
	if outage || (c.err != nil && !errors.Is(c.err, idempotency.ErrNotRunning)) {
		require.ErrorIs(t, c.err, idempotency.ErrStoreUnavailable, "%s, %s, no primary serving the slot", store, c.what)
		return
	}
	switch {
	case strings.HasPrefix(c.what, "Begin"):
		require.False(t, c.started, "%s, %s: a try of an attempt from before the crash started", store, c.what)
		require.Equal(t, idempotency.RefusedUnverifiable, c.refusal, "%s, %s", store, c.what)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, c.state, "%s, %s", store, c.what)
	case strings.HasPrefix(c.what, "Finish"):
		require.ErrorIs(t, c.err, idempotency.ErrNotRunning, "%s, %s", store, c.what)
	default:
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, c.state, "%s, %s", store, c.what)
	}
}

// The primary of a tenant's slot crashes (SIGKILL) and its replica takes
// over, in a Cluster the test starts itself. Before the crash the store
// wrote, with WithReplicas(1), a finished call, a fence and a running try,
// which the replica copied; then, with the replica cut off (stopped, its
// link closed by the primary), a finished call and a fence without WAIT,
// which the primary acknowledged and the replica never saw, and a Begin
// with WAIT, which fell short and was refused. Then the primary dies.
//
// While no primary serves the slot, every Begin, Get, Fence and Finish
// fails within its context with ErrStoreUnavailable. Once the replica is
// promoted, its new replication ID moves the tenant's horizon: the calls
// whose records were lost read UNKNOWN and none of their tries starts,
// rather than reading UNSEEN and running again; the calls whose records
// the replica holds read UNKNOWN too (DESIGN.md §3.7: every try of an
// attempt outside the horizon is ATTEMPT_UNVERIFIABLE, even when its record
// survived), and the try that was running can no longer finish. Attempts
// created after the takeover, plus skew, begin normally; a store that waits
// for a replica refuses them until the crashed node, restarted empty,
// rejoins as the new primary's replica.
func TestRedisClusterPrimaryCrashMovesHorizon(t *testing.T) {
	const tenant = "acme"
	prefix := "tollgate-test:" + randomHex() + ":"
	hk := horizonKey(prefix, tenant)
	cl := startOwnCluster(t, "{t:"+tenant+"}")
	ctx := context.Background()
	owner := cl.owner
	// Reads keys of the replica's slots while it is a replica.
	replica := newNodeClient(t, cl.replica.addr)

	// go-redis re-reads the Cluster's map by itself only after MOVED, ASK or
	// READONLY, and every ClusterStateReloadInterval (default 60 s): a dead
	// primary answers nothing, so the stores would go on dialling it, and
	// answer unavailable, for up to a minute after its replica took over.
	// The store has the map read again after every call that got no reply
	// (reloadAfter): with the default interval kept here, the test shows
	// that the stores reach the new primary within seconds.
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.primaryAddrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() {
		_ = c.Close()
		// A pool that failed to dial PoolSize times probes its address
		// every second, until it sees the pool closed: wait for that, so
		// that goleak finds no goroutine left behind.
		waitFor(t, 5*time.Second, "go-redis's dial probes ending", func() bool {
			buf := make([]byte, 1<<20)
			return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*ConnPool).tryDial")
		})
	})
	_, addr := primaryOf(t, c, hk)
	require.Equal(t, owner.addr, addr, "the tenant's slot %d is on the primary with the replica", cl.slot)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	p.TTL = 5 * time.Minute // nothing expires during the test
	waiting := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 100*time.Millisecond))
	plain := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	stores := []struct {
		name string
		s    *redisstore.Store
	}{{"WithReplicas", waiting}, {"plain", plain}}

	// Acknowledged by the replica: a call finished, a fence, a try running.
	done, fenced := finishedAndFenced(t, waiting, clock, p, tenant)
	running, lost, lostFence, short := done, done, done, done
	running.Call, lost.Call, lostFence.Call, short.Call = "2", "3", "4", "5"
	res, err := waiting.Begin(ctx, idempotency.BeginRequest{Key: running, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	waitFor(t, 10*time.Second, "the replica in sync", func() bool { return inSync(ctx, owner.client, cl.replica.client) })
	require.Equal(t, int64(4), replica.Exists(ctx, hk, recordKey(prefix, done), recordKey(prefix, fenced), recordKey(prefix, running)).Val())
	require.Equal(t, fmt.Sprint(int(tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED)), replica.HGet(ctx, recordKey(prefix, done), "st").Val())

	runID := mustInfo(t, cl.replica.client, "server", "run_id")

	// The replica cut off: stopped, so that it cannot reconnect, and its
	// link closed by the primary, so that nothing written from now on
	// reaches it (not even through a socket buffer).
	cl.replica.signal(t, syscall.SIGSTOP)
	require.NoError(t, owner.client.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err())
	require.Equal(t, "0", mustInfo(t, owner.client, "replication", "connected_slaves"))
	res, err = plain.Begin(ctx, idempotency.BeginRequest{Key: lost, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, plain.Finish(ctx, idempotency.FinishRequest{Key: lost, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")}))
	rec, err := plain.Fence(ctx, lostFence, 1)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	_, err = waiting.Begin(ctx, idempotency.BeginRequest{Key: short, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "no replica acknowledges")
	require.ErrorContains(t, err, "0 of 1 replicas")
	require.Equal(t, int64(3), owner.client.Exists(ctx, recordKey(prefix, lost), recordKey(prefix, lostFence), recordKey(prefix, short)).Val(),
		"the primary holds what it acknowledged")
	oldHorizon := owner.client.HGet(ctx, hk, "id").Val()
	oldReplID := mustInfo(t, owner.client, "replication", "master_replid")
	require.Equal(t, mustInfo(t, owner.client, "server", "run_id")+"/"+oldReplID, oldHorizon)

	// The crash.
	crashed := time.Now()
	owner.kill()
	cl.replica.signal(t, syscall.SIGCONT)

	promoted := func() bool { return role(ctx, cl.replica.client) == "master" }
	outage := 0
	for limit := crashed.Add(20 * time.Second); !promoted(); {
		require.True(t, time.Now().Before(limit), "the replica %s did not take over within 20 s of the crash", cl.replica.addr)
		var rounds [][]crashCall
		for _, st := range stores {
			rounds = append(rounds, crashRound(st.s, clock, lost, done, running))
		}
		// The replica still a replica after the round: no primary served
		// the slot while it ran.
		down := !promoted()
		if down {
			outage++
		}
		for i, st := range stores {
			for _, call := range rounds[i] {
				requireHonest(t, st.name, call, down)
			}
		}
	}
	require.Positive(t, outage, "some calls were made while no primary served the slot")
	promotedAt := time.Now()

	waitFor(t, 10*time.Second, "the surviving nodes' Cluster ok, the slot on the promoted replica", func() bool {
		for _, n := range append(append([]*ownNode{}, cl.primaries...), cl.replica) {
			if n == owner {
				continue
			}
			if v, _ := clusterInfoField(ctx, n.client, "cluster_state"); v != "ok" {
				return false
			}
			//lint:ignore SA1019 go-redis reads the Cluster's map with CLUSTER SLOTS: check what clients read.
			slots, err := n.client.ClusterSlots(ctx).Result()
			if err != nil || !mapsSlot(slots, cl.slot, cl.replica.addr) {
				return false
			}
		}
		return true
	})
	newReplID := mustInfo(t, cl.replica.client, "replication", "master_replid")
	require.NotEqual(t, oldReplID, newReplID, "a promoted replica takes a new replication ID")
	// The copies: what WAIT (or the sync before the cut) confirmed is
	// there, what the primary acknowledged alone is gone.
	require.Equal(t, int64(3), cl.replica.client.Exists(ctx, recordKey(prefix, done), recordKey(prefix, fenced), recordKey(prefix, running)).Val())
	require.Zero(t, cl.replica.client.Exists(ctx, recordKey(prefix, lost), recordKey(prefix, lostFence), recordKey(prefix, short)).Val(),
		"the writes acknowledged without a replica are lost")

	// The stores' client maps the slot to the dead primary until it reads
	// the Cluster's map again; until then they answer unavailable.
	for _, st := range stores {
		var last error
		if !eventually(10*time.Second, func() bool {
			// The test clock stood still through the failover, while
			// Redis's ran on: a store that first sends a script to the
			// promoted replica now (a replica its Cluster map did not list
			// when the store was built) checks that node's clock against
			// the test clock, and would refuse it, seconds apart.
			catchUp(clock)
			calls := crashRound(st.s, clock, lost, done, running)
			for _, call := range calls {
				requireHonest(t, st.name, call, false)
			}
			last = calls[2].err
			return calls[2].err == nil // the Get
		}) {
			t.Fatalf("%s reaching the promoted replica: not within 10s; the last Get: %v", st.name, last)
		}
		t.Logf("%s reached the promoted replica %v after it took over", st.name, time.Since(promotedAt).Round(time.Millisecond))
	}

	for _, st := range stores {
		for _, k := range []idempotency.Key{done, fenced, running, lost, lostFence, short} {
			rec, err := st.s.Get(ctx, k)
			require.NoError(t, err, "%s, call %s", st.name, k.Call)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "%s, call %s", st.name, k.Call)
			for try := uint32(1); try <= 2; try++ {
				res, err := st.s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: try, Deadline: clock.Now().Add(time.Second)})
				require.NoError(t, err, "%s, call %s", st.name, k.Call)
				require.False(t, res.Started, "%s, call %s: try %d of an attempt from before the crash started", st.name, k.Call, try)
				require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal, "%s, call %s, try %d", st.name, k.Call, try)
			}
			rec, err = st.s.Fence(ctx, k, 2)
			if st.s == waiting {
				// No replica is left to acknowledge the horizon it wrote.
				require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "%s, call %s", st.name, k.Call)
				continue
			}
			require.NoError(t, err, "%s, call %s", st.name, k.Call)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "%s, call %s", st.name, k.Call)
		}
		err := st.s.Finish(ctx, idempotency.FinishRequest{Key: running, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED})
		require.ErrorIs(t, err, idempotency.ErrNotRunning, "%s: the try running at the crash cannot finish", st.name)
	}
	// The surviving records are still there: the horizon alone turned them
	// away.
	require.Equal(t, int64(3), cl.replica.client.Exists(ctx, recordKey(prefix, done), recordKey(prefix, fenced), recordKey(prefix, running)).Val())
	require.Equal(t, runID+"/"+newReplID, cl.replica.client.HGet(ctx, hk, "id").Val(), "the horizon names the promoted replica")

	// Attempts created after the takeover, plus skew (by Redis's clock: the
	// horizon moved to its time less the skew, later than the test clock's).
	catchUp(clock)
	clock.Advance(p.Skew)
	fresh := idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: done.Method}
	rec, err = plain.Get(ctx, fresh)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())
	res, err = plain.Begin(ctx, idempotency.BeginRequest{Key: fresh, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, plain.Finish(ctx, idempotency.FinishRequest{Key: fresh, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED}))
	res, err = plain.Begin(ctx, idempotency.BeginRequest{Key: fresh, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedFinished, res.Refusal)
	freshFence := fresh
	freshFence.Call = "1"
	rec, err = plain.Fence(ctx, freshFence, 1)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	// The new primary has no replica: a store that waits for one refuses.
	freshWaiting := fresh
	freshWaiting.Call = "2"
	_, err = waiting.Begin(ctx, idempotency.BeginRequest{Key: freshWaiting, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorContains(t, err, "0 of 1 replicas")

	// The crashed node restarts, empty, from its Cluster config, and
	// rejoins as the promoted replica's replica.
	back := startNode(t, owner.port, owner.busPort, owner.dir)
	waitFor(t, 15*time.Second, "the crashed node back as the new primary's replica", func() bool {
		return cl.replicaAcks(ctx, cl.replica, back)
	})
	res, err = waiting.Begin(ctx, idempotency.BeginRequest{Key: freshWaiting, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "try 2 after the tombstone of try 1's shortfall: %v", res.Refusal)
	freshWaiting.Call = "3"
	rec, err = waiting.Fence(ctx, freshWaiting, 1)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	// The healed Cluster, the promoted replica serving the slot and the
	// crashed node its replica, passes the conformance suite. (New reads
	// every node's settings; go-redis answers its last dial error for a
	// node it failed to dial too often until a probe, every second, reaches
	// it again.)
	waitFor(t, 10*time.Second, "the client mapping and reaching every node, the crashed one included", func() bool {
		var mu sync.Mutex
		seen := false
		err := c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			seen = seen || n.Options().Addr == back.addr
			mu.Unlock()
			return n.Ping(ctx).Err()
		})
		return err == nil && seen
	})
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock, p idempotency.Policy) storetest.Harness {
		prefix := "tollgate-test:" + randomHex() + ":"
		s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
		return storetest.Harness{Store: s, Lose: func(t *testing.T) { deleteClusterPrefix(t, c, prefix) }}
	})
	t.Logf("the replica took over %v after the crash; %d rounds of calls before that answered unavailable",
		promotedAt.Sub(crashed).Round(time.Millisecond), outage)
}

// mapsSlot tells whether slots maps slot to the primary at addr.
func mapsSlot(slots []redis.ClusterSlot, slot int64, addr string) bool {
	for _, r := range slots {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			return len(r.Nodes) > 0 && r.Nodes[0].Addr == addr
		}
	}
	return false
}

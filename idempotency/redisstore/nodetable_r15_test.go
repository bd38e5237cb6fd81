package redisstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// The review found that Store.nodes, the table of node checks, never
// shrinks: every address the Cluster client ever routed a call to keeps its
// entry for the store's life, so a long-lived store on a Cluster whose
// nodes are replaced under new addresses (Kubernetes pods) grows without
// bound. These tests run a Cluster of their own, on ports chosen at
// run time.

// tableNode is a cluster-enabled redis-server of a test's own.
type tableNode struct {
	addr   string
	id     string
	client *redis.Client
	stop   func()
}

// startTableNode starts a cluster-enabled redis-server on a free port
// (startOnPort; its Cluster bus on port+10000), killed at cleanup. It skips
// the test (fails it under TOLLGATE_REQUIRE_REDIS=1) without redis-server.
func startTableNode(t *testing.T) *tableNode {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("TOLLGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("no redis-server binary: %v (TOLLGATE_REQUIRE_REDIS=1)", err)
		}
		t.Skip("no redis-server binary: " + err.Error())
	}
	port, cmd, exited := startOnPort(t, bin, 0, func(port int) []string {
		return []string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", t.TempDir(), "--maxmemory-policy", "noeviction",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	n := &tableNode{addr: addr}
	n.stop = func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	t.Cleanup(n.stop)
	n.client = redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = n.client.Close() })
	ctx := context.Background()
	require.True(t, tableEventually(10*time.Second, func() bool {
		info := n.client.InfoMap(ctx, "server")
		return info.Err() == nil && info.Item("Server", "process_id") == fmt.Sprint(cmd.Process.Pid)
	}), "the redis-server of the test's own answering at %s", addr)
	n.id = n.client.ClusterMyID(ctx).Val()
	require.NotEmpty(t, n.id)
	return n
}

func tableEventually(limit time.Duration, cond func() bool) bool {
	for end := time.Now().Add(limit); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// tableAddrs returns the addresses Store.nodes holds an entry for, sorted.
func tableAddrs(s *Store) []string {
	var addrs []string
	s.nodes.Range(func(k, _ any) bool {
		addrs = append(addrs, k.(string))
		return true
	})
	slices.Sort(addrs)
	return addrs
}

// routedAddr returns the address of the node the Cluster client routes
// key's calls to, as the store names it in Store.nodes (CLUSTER SLOTS may
// name a node alone in its Cluster without its IP).
func routedAddr(t *testing.T, ctx context.Context, client *redis.ClusterClient, s *Store, key idempotency.Key) string {
	t.Helper()
	node, err := client.MasterForKey(ctx, s.keys(key)[0])
	require.NoError(t, err)
	return node.Options().Addr
}

// slotsOwner returns the address CLUSTER SLOTS at n gives for every slot,
// or "" unless one node owns them all.
func slotsOwner(ctx context.Context, n *tableNode) string {
	//lint:ignore SA1019 go-redis reads the Cluster's map with CLUSTER SLOTS: check what clients read.
	slots, err := n.client.ClusterSlots(ctx).Result()
	if err != nil || len(slots) != 1 || slots[0].Start != 0 || slots[0].End != 16383 || len(slots[0].Nodes) == 0 {
		return ""
	}
	return slots[0].Nodes[0].Addr
}

// ownAllSlots makes n, alone, a Cluster that serves every slot.
func ownAllSlots(t *testing.T, ctx context.Context, n *tableNode) {
	t.Helper()
	require.NoError(t, n.client.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", 1).Err())
	require.NoError(t, n.client.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err())
	require.True(t, tableEventually(10*time.Second, func() bool {
		return strings.Contains(n.client.ClusterInfo(ctx).Val(), "cluster_state:ok")
	}), "the Cluster at %s ok", n.addr)
}

// A Cluster's only primary is replaced by a node at another address, which
// takes every slot, and stops: the calls go to the new node, and the store
// must forget the old one's check.
func TestNodeTableForgetsNodeThatLeftCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := joinedPair(t, ctx)

	// The client is seeded with b too (as a Kubernetes service name would
	// lead to the new pod): it reads the map from the seeds, and CLUSTER
	// SLOTS at a names b only once b serves a slot.
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{a.addr, b.addr}, ContextTimeoutEnabled: true})
	defer func() { _ = client.Close() }()
	s, err := New(ctx, client, hooks.RedisClockRecheckAfter(200*time.Millisecond).(Option))
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	aAddr := routedAddr(t, ctx, client, s, key)
	require.Equal(t, []string{aAddr}, tableAddrs(s), "New checked the Cluster's node")

	// b, which has joined, takes every slot (a holds no key yet) and a
	// stops, as a replaced pod does.
	// b's epoch above a's first, or a's claims win over b's, and b, left
	// without a slot, turns into a's replica.
	require.NoError(t, b.client.Do(ctx, "CLUSTER", "BUMPEPOCH").Err())
	for _, n := range []*tableNode{b, a} {
		_, err := n.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for slot := range 16384 {
				p.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", b.id)
			}
			return nil
		})
		if n == a && err != nil && strings.Contains(err.Error(), "SETSLOT only with masters") {
			// a heard of b's claim first and turned into b's replica,
			// as it would have after the moves: the map is b's already.
			continue
		}
		require.NoError(t, err, "moving every slot to b, at %s", n.addr)
	}
	require.True(t, tableEventually(10*time.Second, func() bool {
		return slotsOwner(ctx, a) == b.addr && slotsOwner(ctx, b) == b.addr &&
			strings.Contains(b.client.ClusterInfo(ctx).Val(), "cluster_state:ok")
	}), "b serving every slot, as a and b see it")
	a.stop()

	var lastErr error
	bAddr := ""
	tableEventually(10*time.Second, func() bool {
		if _, lastErr = s.Get(ctx, key); lastErr == nil {
			bAddr = routedAddr(t, ctx, client, s, key)
		}
		return bAddr != "" && bAddr != aAddr && slices.Equal(tableAddrs(s), []string{bAddr})
	})
	require.True(t, bAddr != "" && bAddr != aAddr, "no call went to b: %v", lastErr)
	require.Equal(t, []string{bAddr}, tableAddrs(s),
		"the table of node checks must forget the node that left the Cluster (it keeps an entry for every address ever routed to)")
}

// The store forgets a node no longer in the Cluster client's map only once
// no check of it runs, no refusal of it is in force and no passed check
// vouches for it; a node still in the map keeps its entry.
func TestNodeTableKeepsRunningChecksAndRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := startTableNode(t)
	ownAllSlots(t, ctx, c)

	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{c.addr}, ContextTimeoutEnabled: true})
	defer func() { _ = client.Close() }()
	s, err := New(ctx, client, hooks.RedisClockRecheckAfter(200*time.Millisecond).(Option))
	require.NoError(t, err)
	defer func() { _ = s.Close() }()

	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	own := routedAddr(t, ctx, client, s, key)
	// Four nodes the client routed calls to once, which left the
	// Cluster: one idle, one refused by a failed check (in force for an
	// hour here), one whose check runs, one a passed check vouches for
	// (for an hour here).
	const idle, refused, running, vouched = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"
	s.node(idle)
	rn := s.node(refused)
	rn.mu.Lock()
	rn.refused, rn.refusedAt = refusal{errors.New("found wrong")}, s.since()+int64(time.Hour)
	rn.mu.Unlock()
	un := s.node(running)
	run := &checkRun{done: make(chan struct{})}
	un.mu.Lock()
	un.running = run
	un.mu.Unlock()
	vn := s.node(vouched)
	vn.good.Store(s.since() + int64(time.Hour))
	require.ElementsMatch(t, []string{own, idle, refused, running, vouched}, tableAddrs(s))

	call := func() []string {
		_, err := s.Get(ctx, key)
		require.NoError(t, err)
		return tableAddrs(s)
	}
	tableEventually(5*time.Second, func() bool { return !slices.Contains(call(), idle) })
	require.ElementsMatch(t, []string{own, refused, running, vouched}, tableAddrs(s),
		"the idle node that left is forgotten; the refused one, the one whose check runs, the one a check vouches for and the Cluster's own are kept")

	rn.mu.Lock()
	rn.refusedAt = s.since() - int64(2*failedCheckRefusal)
	rn.mu.Unlock()
	un.mu.Lock()
	un.running = nil
	un.mu.Unlock()
	close(run.done)
	vn.good.Store(0)
	tableEventually(5*time.Second, func() bool { return len(call()) == 1 })
	require.Equal(t, []string{own}, tableAddrs(s), "once the refusal, the check and the vouching ended, they are forgotten")
}

// A call that loaded a node's entry just before prune dropped it starts no
// check on the dropped entry, which the calls after it would not find: it
// takes the table's new entry, which has the node checked again.
func TestNodeTableCallOnDroppedEntryChecksAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := startTableNode(t)
	ownAllSlots(t, ctx, c)

	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{c.addr}, ContextTimeoutEnabled: true})
	defer func() { _ = client.Close() }()
	s, err := New(ctx, client)
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	addr := routedAddr(t, ctx, client, s, key)

	old := s.node(addr)
	old.good.Store(0) // due for its check
	old.mu.Lock()     // as prune holds it, deciding
	done := make(chan error, 1)
	go func() {
		_, err := s.Get(ctx, key)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the call waits for old.mu
	old.dropped = true
	s.nodes.CompareAndDelete(addr, old)
	old.mu.Unlock()
	require.NoError(t, <-done)

	old.mu.Lock()
	require.Nil(t, old.running, "no check started on the dropped entry")
	old.mu.Unlock()
	require.Zero(t, old.good.Load(), "no check vouched for the dropped entry")
	n := s.node(addr)
	require.NotSame(t, old, n)
	require.Greater(t, n.good.Load(), s.since(), "the call had the node checked again, on the table's new entry")
	n.mu.Lock()
	defer n.mu.Unlock()
	require.True(t, n.full, "a node dropped from the table gets every check again, as a new node does")
}

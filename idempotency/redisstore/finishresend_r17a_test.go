package redisstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review (r17) found that a Finish — which records the outcome of a try
// whose handler ran: losing it makes the caller's answer UNKNOWN — was sent
// once more only when its script found another Redis (run_id) behind its
// node's address. Redis refuses a script before it runs it in more cases
// just after a failover, a restart or during a slot migration: TRYAGAIN
// (keys split between a migrating slot's source and target), CLUSTERDOWN
// (a slot not served), LOADING (a restarted Redis reading its data) and
// MASTERDOWN (a replica whose link to its primary is down). go-redis sends
// the command again a few times on those, in well under a second, and then
// the Finish failed, although resending it is safe: each test below shows
// first, with a script of its own, that Redis wrote nothing. The Finish now
// resends on those replies too, in the same paced loop bounded by 5 s.
//
// The same review found that the loop's bound was checked only between
// resends (a resend's wait for a check, and the resend itself, ran on the
// caller's context: up to one more check's time past the bound); that on a
// Cluster a script that go-redis followed (ASK, MOVED) to a node of another
// run_id reset the check of the source node, which had not changed, and
// the error named the source's address with the target's run_id; and that
// concurrent looping Finishes each read the Cluster's map (CLUSTER SLOTS)
// before every resend.
//
// These tests run Redis servers of their own, on ports chosen at run time.

// r17aWrites is a script that writes its first key, then its second: it
// shows that a reply refused the script before it ran (it wrote nothing).
var r17aWrites = redis.NewScript(`redis.call('SET', KEYS[1], 'ran') redis.call('SET', KEYS[2], 'ran') return 1`)

// r17aHook records, for the scripts a client sends (EVALSHA, EVAL), the
// deadline of each call's context, and signals on replies the first word
// of each error reply (the last one go-redis got, on a ClusterClient's
// hook: after its own resends).
type r17aHook struct {
	mu        sync.Mutex
	deadlines []time.Time
	replies   chan string
	other     atomic.Int64 // replies of a script that found another Redis ({15, run_id})
}

func newR17aHook() *r17aHook { return &r17aHook{replies: make(chan string, 256)} }

func (*r17aHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (*r17aHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *r17aHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		if name == "evalsha" || name == "eval" {
			dl, _ := ctx.Deadline()
			h.mu.Lock()
			h.deadlines = append(h.deadlines, dl)
			h.mu.Unlock()
		}
		err := next(ctx, cmd)
		if name != "evalsha" && name != "eval" {
			return err
		}
		var reply redis.Error
		if errors.As(err, &reply) {
			word, _, _ := strings.Cut(reply.Error(), " ")
			select {
			case h.replies <- word:
			default:
			}
		}
		if c, ok := cmd.(*redis.Cmd); ok {
			if v, e := c.Slice(); e == nil && len(v) == 2 && num(v[0]) == kindOtherRedis {
				h.other.Add(1)
				select {
				case h.replies <- "OTHER":
				default:
				}
			}
		}
		return err
	}
}

// waitReply waits for a reply whose first word is word.
func (h *r17aHook) waitReply(ctx context.Context, word string) error {
	for {
		select {
		case w := <-h.replies:
			if w == word {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for a %s reply: %w", word, ctx.Err())
		}
	}
}

func r17aFinishReq(key idempotency.Key) idempotency.FinishRequest {
	return idempotency.FinishRequest{Key: key, Try: 1, Minted: true,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("done")}
}

func r17aBegin(t *testing.T, ctx context.Context, s *Store, call string) idempotency.Key {
	t.Helper()
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: call, Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: time.Now().Add(30 * time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started)
	return key
}

// endMigration gives slot to b, which imports it from a.
// r17aClusterStore returns a store on a Cluster client that starts from
// node a (opts may change the client's options), with an r17aHook on the
// client; both are closed at cleanup.
func r17aClusterStore(t *testing.T, ctx context.Context, a *tableNode, prefix string, opts ...func(*redis.ClusterOptions)) (*Store, *r17aHook) {
	t.Helper()
	o := &redis.ClusterOptions{Addrs: []string{a.addr}, ContextTimeoutEnabled: true}
	for _, f := range opts {
		f(o)
	}
	hook := newR17aHook()
	return storeOn(t, ctx, redis.NewClusterClient(o), hook, WithPrefix(prefix)), hook
}

// r17aSlotOf is the slot of key's keys (one hash tag) on node a, and the
// keys.
func r17aSlotOf(t *testing.T, ctx context.Context, s *Store, a *tableNode, key idempotency.Key) (int64, []string) {
	t.Helper()
	keys := s.keys(key)
	slot, err := a.client.ClusterKeySlot(ctx, keys[0]).Result()
	require.NoError(t, err)
	return slot, keys
}

// r17aMigratingMany begins n calls ("0" … n-1) of one attempt, starts
// migrating their slot from a to b and moves the horizon key and every
// call's record there: each Finish of them is then sent to a node (ASK)
// with another run_id until the migration ends. It returns the calls' keys
// and the slot.
func r17aMigratingMany(t *testing.T, ctx context.Context, s *Store, a, b *tableNode, n int) ([]idempotency.Key, int64) {
	t.Helper()
	var ks []idempotency.Key
	for i := range n {
		ks = append(ks, r17aBegin(t, ctx, s, fmt.Sprint(i)))
	}
	slot, keys := r17aSlotOf(t, ctx, s, a, ks[0])
	startMigrating(t, ctx, a, b, slot)
	all := []string{keys[0]}
	for _, k := range ks {
		all = append(all, s.keys(k)[1])
	}
	migrate(t, ctx, a, b, all...)
	return ks, slot
}

func endMigration(ctx context.Context, a, b *tableNode, slot int64) error {
	err := b.client.Do(ctx, "CLUSTER", "BUMPEPOCH").Err()
	for _, n := range []*tableNode{b, a} {
		if err == nil {
			err = n.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", b.id).Err()
		}
	}
	return err
}

// TRYAGAIN: the tenant's slot migrates, and only the record has moved yet.
// Also: every resend is bounded by the loop's 5 s (its context's deadline).
func TestR17aFinishResentAfterTryAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := joinedPair(t, ctx)
	s, hook := r17aClusterStore(t, ctx, a, "r17a-tryagain:")
	key := r17aBegin(t, ctx, s, "0")
	slot, keys := r17aSlotOf(t, ctx, s, a, key)
	startMigrating(t, ctx, a, b, slot)
	migrate(t, ctx, a, b, keys[1])

	// Redis refuses a script whose keys are split before it runs it.
	probe := []string{keys[0] + "-probe", keys[0]}
	require.True(t, redis.HasErrorPrefix(r17aWrites.Run(ctx, a.client, probe).Err(), "TRYAGAIN"))
	require.Equal(t, int64(0), a.client.Exists(ctx, probe[0]).Val(), "the refused script wrote")

	moved := make(chan error, 1)
	go func() {
		if err := hook.waitReply(ctx, "TRYAGAIN"); err != nil {
			moved <- err
			return
		}
		migrate(t, ctx, a, b, keys[0])
		moved <- endMigration(ctx, a, b, slot)
	}()
	hook.mu.Lock()
	hook.deadlines = nil // the Finish's sends only
	hook.mu.Unlock()
	start := time.Now()
	err := s.Finish(ctx, r17aFinishReq(key))
	require.NoError(t, <-moved)
	require.NoError(t, err, "the handler's outcome was lost to TRYAGAIN")
	st, err := b.client.HGet(ctx, keys[1], "st").Result()
	require.NoError(t, err)
	require.Equal(t, "3", st, "the record on b is not SUCCEEDED")

	hook.requireBounded(t, ctx, start)
}

// requireBounded requires that the scripts sent after the first send of a
// Finish called at start on ctx (its EVALSHA, and EVAL after NOSCRIPT, on
// ctx itself) ran on contexts ending by the loop's 5 s: the loop's bound
// counts from the first send, just after start; ctx ends a minute later.
func (h *r17aHook) requireBounded(t *testing.T, ctx context.Context, start time.Time) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	caller, _ := ctx.Deadline()
	first := 0
	for first < len(h.deadlines) && h.deadlines[first].Equal(caller) {
		first++
	}
	require.Positive(t, first, "the first send did not run on the caller's context")
	require.Less(t, first, len(h.deadlines), "no resend ran on a context bounded by the loop (%d sends)", len(h.deadlines))
	for i, dl := range h.deadlines[first:] {
		require.False(t, dl.After(start.Add(nodeCheckTimeout+time.Second)), "resend %d ran on a context ending at %v, past the loop's %v bound", i+1, dl, nodeCheckTimeout)
	}
}

// CLUSTERDOWN: the tenant's slot is not served for a while.
func TestR17aFinishResentAfterClusterDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startTableNode(t)
	ownAllSlots(t, ctx, a)
	s, hook := r17aClusterStore(t, ctx, a, "r17a-down:")
	key := r17aBegin(t, ctx, s, "0")
	slot, keys := r17aSlotOf(t, ctx, s, a, key)
	require.NoError(t, a.client.Do(ctx, "CLUSTER", "DELSLOTS", slot).Err())
	require.True(t, tableEventually(10*time.Second, func() bool {
		return strings.Contains(a.client.ClusterInfo(ctx).Val(), "cluster_state:fail")
	}))

	probe := []string{keys[0] + "-probe", keys[0]}
	require.True(t, redis.HasErrorPrefix(r17aWrites.Run(ctx, a.client, probe).Err(), "CLUSTERDOWN"))
	require.Equal(t, int64(0), a.client.Exists(ctx, probe[0]).Val(), "the refused script wrote")

	served := make(chan error, 1)
	go func() {
		if err := hook.waitReply(ctx, "CLUSTERDOWN"); err != nil {
			served <- err
			return
		}
		served <- a.client.Do(ctx, "CLUSTER", "ADDSLOTS", slot).Err()
	}()
	err := s.Finish(ctx, r17aFinishReq(key))
	require.NoError(t, <-served)
	require.NoError(t, err, "the handler's outcome was lost to CLUSTERDOWN")
	st, err := a.client.HGet(ctx, keys[1], "st").Result()
	require.NoError(t, err)
	require.Equal(t, "3", st, "the record is not SUCCEEDED")
}

// r17aServer starts a redis-server of the test's own on a free port
// (startOnPort; no Cluster), with extra arguments, and returns a client of
// it (its Options().Addr the server's address) and a function that stops it
// (SIGTERM), also run at cleanup.
func r17aServer(t *testing.T, dir string, extra ...string) (*redis.Client, func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("TOLLGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("no redis-server binary: %v (TOLLGATE_REQUIRE_REDIS=1)", err)
		}
		t.Skip("no redis-server binary: " + err.Error())
	}
	port, cmd, exited := startOnPort(t, bin, 0, func(port int) []string {
		return append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--maxmemory-policy", "noeviction"}, extra...)
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	t.Cleanup(stop)
	require.True(t, tableEventually(10*time.Second, func() bool {
		info := c.InfoMap(context.Background(), "server")
		return info.Err() == nil && info.Item("Server", "process_id") == fmt.Sprint(cmd.Process.Pid)
	}), "the redis-server of the test's own answering at %s", addr)
	return c, stop
}

// MASTERDOWN: the Redis became a replica of a primary it cannot reach
// (replica-serve-stale-data no), until it is made a primary again.
func TestR17aFinishResentAfterMasterDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, _ := r17aServer(t, t.TempDir(), "--replica-serve-stale-data", "no")
	client := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, ContextTimeoutEnabled: true})
	defer func() { _ = client.Close() }()
	hook := newR17aHook()
	client.AddHook(hook)
	s, err := New(ctx, client, WithPrefix("r17a-masterdown:"))
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	key := r17aBegin(t, ctx, s, "0")
	keys := s.keys(key)
	require.NoError(t, admin.Do(ctx, "REPLICAOF", "127.0.0.1", ownPort(t)).Err()) // nothing listens there

	probe := []string{keys[0] + "-probe", keys[0]}
	require.True(t, redis.HasErrorPrefix(r17aWrites.Run(ctx, admin, probe).Err(), "MASTERDOWN"))
	require.Equal(t, int64(0), admin.Exists(ctx, probe[0]).Val(), "the refused script wrote")

	promoted := make(chan error, 1)
	go func() {
		if err := hook.waitReply(ctx, "MASTERDOWN"); err != nil {
			promoted <- err
			return
		}
		promoted <- admin.Do(ctx, "REPLICAOF", "NO", "ONE").Err()
	}()
	err = s.Finish(ctx, r17aFinishReq(key))
	require.NoError(t, <-promoted)
	require.NoError(t, err, "the handler's outcome was lost to MASTERDOWN")
	st, err := admin.HGet(ctx, keys[1], "st").Result()
	require.NoError(t, err)
	require.Equal(t, "3", st, "the record is not SUCCEEDED")
}

// LOADING: Redis restarts behind the same address and reads its data
// (slowly here: key-load-delay) for longer than go-redis's own resends.
func TestR17aFinishResentAfterLoading(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	admin, stop := r17aServer(t, dir)
	addr := admin.Options().Addr
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer func() { _ = client.Close() }()
	s, err := New(ctx, client, WithPrefix("r17a-loading:"))
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	key := r17aBegin(t, ctx, s, "0")
	keys := s.keys(key)
	// Filler for the restarted Redis to load slowly, then a snapshot.
	_, err = admin.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range 1500 {
			p.Set(ctx, fmt.Sprintf("r17a-filler:%d", i), strings.Repeat("x", 100), 0)
		}
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, admin.Save(ctx).Err())
	stop()
	// 1500 keys at 1 ms each: some 1.5 s of LOADING, answering meanwhile.
	cmd := exec.Command("redis-server", "--port", addr[strings.LastIndexByte(addr, ':')+1:], "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--maxmemory-policy", "noeviction", "--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024")
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	})
	require.True(t, tableEventually(10*time.Second, func() bool {
		info := admin.InfoMap(ctx, "server", "persistence")
		return info.Err() == nil && info.Item("Server", "process_id") == fmt.Sprint(cmd.Process.Pid) &&
			info.Item("Persistence", "loading") == "1"
	}), "the restarted Redis loading")
	probe := []string{keys[0] + "-probe", keys[0]}
	require.True(t, redis.HasErrorPrefix(r17aWrites.Run(ctx, admin, probe).Err(), "LOADING"))

	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	err = s.Finish(fctx, r17aFinishReq(key))
	require.NoError(t, err, "the handler's outcome was lost to LOADING")
	require.Equal(t, int64(0), admin.Exists(ctx, probe[0]).Val(), "the script refused LOADING wrote")
	st, err := admin.HGet(ctx, keys[1], "st").Result()
	require.NoError(t, err)
	require.Equal(t, "3", st, "the record is not SUCCEEDED")
}

// r17aConfigHook counts the full checks (CONFIG GET maxmemory-policy in a
// pipeline) sent to the node at addr.
type r17aConfigHook struct {
	addr string
	full *atomic.Int64
}

func (r17aConfigHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r17aConfigHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}

func (h r17aConfigHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if args := c.Args(); len(args) == 3 && fmt.Sprint(args[0]) == "config" && fmt.Sprint(args[2]) == "maxmemory-policy" {
				h.full.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// A script go-redis followed (ASK) to a node of another run_id leaves the
// check of the source node, which did not change, alone, and the error
// does not name the source's address as the Redis of the target's run_id.
func TestR17aRedirectedMismatchSparesTheSource(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := joinedPair(t, ctx)
	var fullA atomic.Int64
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{a.addr}, ContextTimeoutEnabled: true,
		NewClient: func(o *redis.Options) *redis.Client {
			c := redis.NewClient(o)
			if o.Addr == a.addr {
				c.AddHook(r17aConfigHook{addr: a.addr, full: &fullA})
			}
			return c
		}})
	defer func() { _ = client.Close() }()
	s, err := New(ctx, client, WithPrefix("r17a-attribute:"))
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	key := r17aBegin(t, ctx, s, "0")
	keys := s.keys(key)
	slot, err := a.client.ClusterKeySlot(ctx, keys[0]).Result()
	require.NoError(t, err)
	startMigrating(t, ctx, a, b, slot)
	moveKeys(t, ctx, a, b, keys)
	bID := b.client.InfoMap(ctx, "server").Item("Server", "run_id")
	require.NotEmpty(t, bID)

	before := fullA.Load()
	fctx, fcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer fcancel()
	err = s.Finish(fctx, r17aFinishReq(key))
	require.Error(t, err, "the migration still runs")
	require.True(t, errors.As(err, new(sentError)), "the error does not say the script may have been sent: %v", err)
	require.Equal(t, before, fullA.Load(), "the source node %s, unchanged, was checked in full again", a.addr)
	require.NotContains(t, err.Error(), "another Redis at "+a.addr+" (run_id "+bID, "the error names the source with the target's run_id")
	n := s.node(a.addr)
	n.mu.Lock()
	full := n.full
	n.mu.Unlock()
	require.True(t, full, "the source's check was reset")
}

// Concurrent looping Finishes share their reads of the Cluster's map.
func TestR17aConcurrentFinishesShareMapReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := joinedPair(t, ctx)
	var reads atomic.Int64
	s, hook := r17aClusterStore(t, ctx, a, "r17a-share:", func(o *redis.ClusterOptions) {
		o.Addrs = nil
		o.ClusterSlots = func(ctx context.Context) ([]redis.ClusterSlot, error) {
			reads.Add(1)
			//lint:ignore SA1019 go-redis reads the Cluster's map with CLUSTER SLOTS: give it what a node answers.
			return a.client.ClusterSlots(ctx).Result()
		}
	})
	const n = 8
	ks, slot := r17aMigratingMany(t, ctx, s, a, b, n)

	const refusals = 6 * n
	reads.Store(0)
	moved := make(chan error, 1)
	go func() {
		for hook.other.Load() < refusals {
			if err := hook.waitReply(ctx, "OTHER"); err != nil {
				moved <- err
				return
			}
		}
		moved <- endMigration(ctx, a, b, slot)
	}()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, k := range ks {
		wg.Go(func() { errs[i] = s.Finish(ctx, r17aFinishReq(k)) })
	}
	wg.Wait()
	require.NoError(t, <-moved)
	for i, err := range errs {
		require.NoError(t, err, "Finish %d", i)
	}
	got, other := reads.Load(), hook.other.Load()
	t.Logf("%d map reads for %d resends of %d concurrent Finishes", got, other, n)
	require.LessOrEqual(t, 2*got, other, "%d map reads for %d resends of %d concurrent Finishes", got, other, n)
}

// Every resend of a Finish whose script found another Redis (a node a slot
// migrates to, reached by ASK) runs on a context bounded by the loop's
// 5 s, not on the caller's, which ends a minute later. (Added after the
// fix, which TestR17aFinishResentAfterTryAgain also checks: that test
// failed on TRYAGAIN before reaching this check on the code before it.)
func TestR17aResendsBoundedByTheLoop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := joinedPair(t, ctx)
	s, hook := r17aClusterStore(t, ctx, a, "r17a-bound:")
	key := r17aBegin(t, ctx, s, "0")
	slot, keys := r17aSlotOf(t, ctx, s, a, key)
	startMigrating(t, ctx, a, b, slot)
	moveKeys(t, ctx, a, b, keys)

	moved := make(chan error, 1)
	go func() {
		for hook.other.Load() < 3 {
			if err := hook.waitReply(ctx, "OTHER"); err != nil {
				moved <- err
				return
			}
		}
		moved <- endMigration(ctx, a, b, slot)
	}()
	hook.mu.Lock()
	hook.deadlines = nil // the Finish's sends only
	hook.mu.Unlock()
	start := time.Now()
	err := s.Finish(ctx, r17aFinishReq(key))
	require.NoError(t, <-moved)
	require.NoError(t, err)

	hook.requireBounded(t, ctx, start)
}

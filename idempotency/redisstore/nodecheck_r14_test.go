package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// joinedNode is a one-node Cluster of the test's own that serves a store,
// and a second node b, started with args, that joined it after New and
// took the slot of tenant acme's keys.
type joinedNode struct {
	store *redisstore.Store
	clk   *shiftClock // the store's clock
	b     *redis.Client
	bAddr string
	hk    string // acme's horizon key, on b
}

// joinAfterNew builds a joinedNode; the store has the options opts besides
// its prefix, storetest.Policy and clk.
func joinAfterNew(t *testing.T, args []string, opts ...redisstore.Option) joinedNode {
	t.Helper()
	ctx := context.Background()
	aAddr, _, a := ownClusterNode(t)
	require.NoError(t, a.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").Err())
	waitFor(t, 10*time.Second, "the one-node Cluster ok", func() bool {
		return strings.Contains(a.ClusterInfo(ctx).Val(), "cluster_state:ok")
	})
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{aAddr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	clk := &shiftClock{}
	const prefix = "join:"
	s := newStore(t, cc, prefix, append([]redisstore.Option{redisstore.WithPolicy(storetest.Policy()),
		hooks.RedisClock(clk.now).(redisstore.Option)}, opts...)...)

	bAddr, bBus, b := ownClusterNode(t, args...)
	host, port, err := net.SplitHostPort(bAddr)
	require.NoError(t, err)
	require.NoError(t, a.Do(ctx, "CLUSTER", "MEET", host, port, bBus).Err())
	aID, bID := a.Do(ctx, "CLUSTER", "MYID").Val(), b.Do(ctx, "CLUSTER", "MYID").Val()
	waitFor(t, 10*time.Second, "the nodes knowing each other", func() bool {
		return strings.Contains(a.ClusterNodes(ctx).Val(), fmt.Sprint(bID)) &&
			strings.Contains(b.ClusterNodes(ctx).Val(), fmt.Sprint(aID))
	})
	hk := horizonKey(prefix, "acme")
	slot, err := a.ClusterKeySlot(ctx, hk).Result()
	require.NoError(t, err)
	require.NoError(t, b.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", aID).Err())
	require.NoError(t, a.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", bID).Err())
	require.NoError(t, b.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", bID).Err())
	require.NoError(t, a.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", bID).Err())
	waitFor(t, 10*time.Second, "the Cluster ok, and the client seeing b serve acme's slot", func() bool {
		if !strings.Contains(a.ClusterInfo(ctx).Val(), "cluster_state:ok") ||
			!strings.Contains(b.ClusterInfo(ctx).Val(), "cluster_state:ok") {
			return false
		}
		cc.ReloadState(ctx)
		node, err := cc.MasterForKey(ctx, hk)
		return err == nil && node.Options().Addr == bAddr
	})
	return joinedNode{store: s, clk: clk, b: b, bAddr: bAddr, hk: hk}
}

// acmeKey is a key of tenant acme, whose slot b serves, at clk's now.
func (j joinedNode) acmeKey(call string) idempotency.Key {
	return idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(j.clk.now()), Call: call, Method: "/x.Y/Z"}
}

// checksRun returns how many times the store's node check ran on the
// Redis behind c: how many CONFIG GETs c's server answered (the check
// reads maxmemory-policy; no script or other call sends one).
func checksRun(t *testing.T, c *redis.Client) int {
	t.Helper()
	return commandCalls(t, c, "config|get")
}

var cmdstatCalls = regexp.MustCompile(`(?m)^cmdstat_([^:]+):calls=(\d+)`)

// commandCalls returns how many calls of command cmd (as INFO commandstats
// names it: "config|get", "time") the Redis behind c answered.
func commandCalls(t *testing.T, c *redis.Client, cmd string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for _, m := range cmdstatCalls.FindAllStringSubmatch(info, -1) {
		if m[1] == cmd {
			n, err := strconv.Atoi(m[2])
			require.NoError(t, err)
			return n
		}
	}
	return 0
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// The check of a Cluster node that joins after New runs on the caller's
// context, once per caller that finds the node unchecked: many callers
// hitting a new node at once run as many checks (four round trips each) on
// it. Here 32 callers reach b at once: b must have been checked once.
func TestRedisJoinedNodeCheckedOnceForConcurrentCallers(t *testing.T) {
	j := joinAfterNew(t, nil)
	ctx := context.Background()
	const callers = 32
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make(chan error, callers)
	)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := j.store.Get(ctx, j.acmeKey(fmt.Sprint(i)))
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 1, checksRun(t, j.b), "callers that reached the new node at once each ran its check")
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// The check of a node that joined after New runs on the caller's context:
// a caller with a short deadline (or one already spent) fails the check,
// which then has to start over at the next call, and every caller whose
// deadline is shorter than the check's four round trips fails in turn.
// The check must run detached from any one caller, to its end: here the
// first caller's context is already spent, and its call fails, but the
// check it started completes on its own, and the next call runs none.
func TestRedisJoinedNodeCheckOutlivesShortCaller(t *testing.T) {
	j := joinAfterNew(t, nil)
	spent, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err := j.store.Get(spent, j.acmeKey("short"))
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.Zero(t, j.b.Exists(context.Background(), j.hk).Val(), "a call whose context was spent wrote on b")

	waitFor(t, 10*time.Second, "the check the spent caller started running to its end on b", func() bool {
		return checksRun(t, j.b) == 1
	})
	_, err = j.store.Get(context.Background(), j.acmeKey("next"))
	require.NoError(t, err)
	require.Equal(t, 1, checksRun(t, j.b), "the node was checked again: the spent caller's check did not count")
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// A node that fails its check is checked again at its next call: every
// call whose slot a broken node serves runs the whole check (four round
// trips) on it first, a hot loop of checks against the node that is least
// able to take them. A failed check must refuse calls to the node for a
// second, then be run again. Here b's maxmemory-policy is allkeys-lru: 20
// calls in a row fail, after one check; a later call checks again.
func TestRedisFailedNodeCheckRefusesForASecond(t *testing.T) {
	j := joinAfterNew(t, []string{"--maxmemory-policy", "allkeys-lru"})
	ctx := context.Background()
	for range 20 {
		_, err := j.store.Get(ctx, j.acmeKey("0"))
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
		require.ErrorContains(t, err, "maxmemory-policy")
		require.ErrorContains(t, err, j.bAddr)
	}
	require.Equal(t, 1, checksRun(t, j.b), "each call to a node that failed its check checked it again")
	require.Zero(t, j.b.Exists(ctx, j.hk).Val(), "nothing was written on b")

	// A second later the node is checked again (and fails again).
	waitFor(t, 10*time.Second, "the failed node checked again", func() bool {
		_, err := j.store.Get(ctx, j.acmeKey("0"))
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
		return checksRun(t, j.b) == 2
	})
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// Redis's clock is compared with the servers' only at New (and at a
// Cluster node's first use): "a clock stepped after that check is not
// seen, and matters: a Redis whose clock is behind the servers' by more
// than the skew moves a lost horizon to a call's own reading rather than
// to Redis's time, so an attempt created after that reading whose record
// was lost could run again" (README). The store must read each node's
// clock again about once a minute (here every 100 ms, hooks), refuse the
// node while it is off, and use it again once it is right.
func TestRedisClockSteppedAfterNewIsSeen(t *testing.T) {
	c, prefix := newClient(t)
	clk := &shiftClock{}
	s := newStore(t, c, prefix, redisstore.WithPolicy(storetest.Policy()),
		hooks.RedisClock(clk.now).(redisstore.Option), hooks.RedisClockRecheckAfter(100*time.Millisecond).(redisstore.Option))
	ctx := context.Background()
	key := func(tenant string) idempotency.Key {
		return idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(clk.now()), Call: "0", Method: "/x.Y/Z"}
	}
	_, err := s.Get(ctx, key("before"))
	require.NoError(t, err)

	// The servers' clock steps 10 s ahead: Redis's is behind by 10 s.
	clk.off.Store(int64(10 * time.Second))
	time.Sleep(150 * time.Millisecond) // past the recheck interval
	_, err = s.Get(ctx, key("stepped"))
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a Redis clock 10 s behind the servers' went unseen")
	require.ErrorContains(t, err, "clock")
	require.Zero(t, c.Exists(ctx, horizonKey(prefix, "stepped")).Val(), "a refused call wrote its horizon")

	// Set right again, the node is checked again and used.
	clk.off.Store(0)
	waitFor(t, 10*time.Second, "the store using Redis again once its clock is right", func() bool {
		_, err := s.Get(ctx, key("after"))
		return err == nil
	})
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// Once a node passed its check, the store trusts it: a later sign that
// Redis's clock stepped back, behind what the store saw before, is not
// taken as a reason to check the node again, although a clock stepped back
// is what a node restored or replaced behind the same address shows. When
// the store sees Redis's clock (against the server's) step back by more
// than the second New allows beyond the skew, it must redo the node's
// whole check, not its clock alone. Here the Redis behind the store gets
// maxmemory-policy allkeys-lru after New, and its clock is seen 2 s behind
// where it was (the policy's skew is 2 s, so the clock alone passes): the
// store must refuse it.
func TestRedisClockSteppedBackRedoesNodeCheck(t *testing.T) {
	addr, _ := ownRedis(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	p := storetest.Policy()
	p.Skew = 2 * time.Second
	clk := &shiftClock{}
	s := newStore(t, c, "back:", redisstore.WithPolicy(p), hooks.RedisClock(clk.now).(redisstore.Option),
		hooks.RedisClockRecheckAfter(100*time.Millisecond).(redisstore.Option))
	ctx := context.Background()
	key := func(call string) idempotency.Key {
		return idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clk.now()), Call: call, Method: "/x.Y/Z"}
	}
	_, err := s.Get(ctx, key("0"))
	require.NoError(t, err)

	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	clk.off.Store(int64(2 * time.Second)) // Redis's clock, against the server's, steps 2 s back
	waitFor(t, 10*time.Second, "the store refusing the node after its clock stepped back", func() bool {
		_, err := s.Get(ctx, key("1"))
		if err != nil {
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
			require.ErrorContains(t, err, "maxmemory-policy")
		}
		return err != nil
	})
}

// The periodic clock check costs no round trip of its own on a call's
// path within its interval: with the default minute, calls after New send
// Redis their scripts and nothing else (the scripts' own TIME aside).
func TestRedisNodeCheckAddsNoRoundTripPerCall(t *testing.T) {
	addr, _ := ownRedis(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, "hot:", redisstore.WithPolicy(storetest.Policy()))
	ctx := context.Background()
	configs, infos := commandCalls(t, c, "config|get"), commandCalls(t, c, "info")
	for i := range 50 {
		_, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: fmt.Sprint(i), Method: "/x.Y/Z"})
		require.NoError(t, err)
	}
	require.Equal(t, configs, commandCalls(t, c, "config|get"), "calls read Redis's configuration")
	// Each Get's script reads INFO server, replication and stats (identity);
	// the test's own INFO commandstats count twice since infos was read.
	require.Equal(t, infos+50*3+2, commandCalls(t, c, "info"), "calls sent INFO of their own")
}

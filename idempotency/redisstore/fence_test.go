package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that DefaultKeep's doc says a try that a late Begin started "is
// finished UNKNOWN: no handler runs it". Begin sends that finish through
// the finish script with a fresh reading, which refuses a try whose lease
// (d + skew) ended: a late Begin of a try with a short deadline leaves the
// try it began on a vouched-for absence IN_PROGRESS, read ABANDONED for the
// rest of the TTL, and never UNKNOWN. (regression14's "later than the keep"
// subtest reads UNKNOWN only because there the new record has expired too.)
func TestRecordsLateBeginOfShortTryIsLeftAbandoned(t *testing.T) {
	_, prefix := newClient(t)
	c := onePoolClient(t, nil)
	plain, _ := newClient(t)
	p := latePolicy
	clk := newArmedClock(0)
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), hooks.RedisClock(clk.now).(redisstore.Option),
		hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	ctx := context.Background()
	k, ts := succeededCall(t, s, clk.now, p.Skew)
	rk := recordKey(prefix, k)

	time.Sleep(time.Until(ts.Add(-p.Skew + p.TTL - 300*time.Millisecond)))
	held := c.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	done := make(chan error, 1)
	clk.arm()
	go func() {
		_, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(100 * time.Millisecond)})
		done <- err
	}()
	<-clk.read
	waitFor(t, 10*time.Second, "Redis removing the SUCCEEDED record", func() bool { return plain.Exists(ctx, rk).Val() == 0 })
	require.NoError(t, held.Close())
	require.ErrorIs(t, <-done, idempotency.ErrStoreUnavailable)

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "a try a late Begin started is finished UNKNOWN")
}

// A review found that commit 98391f5 handles a Begin whose script ran more than the keep
// after its clock reading only when the reply arrives (late → finish the
// begun try UNKNOWN). When the reply of such a late run is lost (the context
// ends, or go-redis gives up), Begin took the error path and its fence (endBegun)
// ended the begun try FENCED — a tombstone that licenses the next try. The
// late run had vouched, with its stale now, for the absence of a SUCCEEDED
// record that Redis had already removed: the next try starts and the
// handler of a call that SUCCEEDED runs again (DESIGN.md §3.7).
//
// Real clock, real Redis; the keep is shortened (hooks.RedisKeep) so the
// wait for the pooled connection need not exceed 30 s.
func TestRecordsLateBeginLostReplyFencesSucceededCall(t *testing.T) {
	_, prefix := newClient(t)
	d := &lossyDialer{mode: lossTimeout}
	c := onePoolClient(t, func(o *redis.Options) { o.Dialer = d.dial })
	plain, _ := newClient(t)
	p := latePolicy
	clk := newArmedClock(0)
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), hooks.RedisClock(clk.now).(redisstore.Option),
		hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	ctx := context.Background()
	k, ts := succeededCall(t, s, clk.now, p.Skew)
	rk := recordKey(prefix, k)

	// Try 2's Begin reads the clock shortly before absence stops being
	// evidence (ts - skew + TTL), then waits for the only pooled connection
	// until Redis removed the SUCCEEDED record (its expiry plus the keep).
	vouchEnd := ts.Add(-p.Skew + p.TTL)
	time.Sleep(time.Until(vouchEnd.Add(-300 * time.Millisecond)))
	held := c.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	clk.arm()
	go func() {
		_, err := s.Begin(bctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(2 * time.Second)})
		done <- err
	}()
	<-clk.read
	waitFor(t, 10*time.Second, "Redis removing the SUCCEEDED record", func() bool {
		return plain.Exists(ctx, rk).Val() == 0
	})
	// The script runs now, with the stale reading; its reply is lost and the
	// caller's context ends before go-redis would send it again.
	d.onLoss = cancel
	d.arm()
	require.NoError(t, held.Close())
	waitFor(t, 10*time.Second, "Begin's reply being lost", func() bool { return d.lost.Load() == 1 })
	cancel()
	require.ErrorIs(t, <-done, idempotency.ErrStoreUnavailable)

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	t.Logf("the key now reads %v (fenced through %d)", rec.GetState(), rec.GetFencedThroughTry())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 3, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 3 of a call whose try 1 SUCCEEDED started: the late Begin's lost reply had its try fenced, not ended UNKNOWN")
}

// A review found that a Fence that waited for a pooled connection (no Redis stall) longer than
// the keep runs its script with its stale reading: the SUCCEEDED record is
// gone from Redis, the stale now vouches for its absence, and the script
// writes a tombstone FENCED(1). Fence then fails STORE_UNAVAILABLE ("instead
// of acting on its judgement", DefaultKeep's doc) but the tombstone stays,
// live for a TTL from the stale reading: try 2 of the call that SUCCEEDED
// begins. Begin's same case was fixed (the begun try is ended UNKNOWN);
// Fence's was not. Real clock; the keep shortened to 300 ms.
func TestStoreLateFenceTombstoneLetsSucceededCallRunAgain(t *testing.T) {
	_, prefix := newClient(t)
	c := onePoolClient(t, nil)
	plain, _ := newClient(t)
	p := latePolicy
	clk := newArmedClock(0)
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), hooks.RedisClock(clk.now).(redisstore.Option),
		hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	ctx := context.Background()
	k, ts := succeededCall(t, s, clk.now, p.Skew)
	// The owner's FenceAttempt(1) reads the clock shortly before absence
	// stops being evidence, then waits for the only pooled connection.
	require.ErrorIs(t, lateFence(t, s, c, plain, prefix, clk, p, k, ts), idempotency.ErrStoreUnavailable, "the late Fence is refused")

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	t.Logf("after the late Fence the key reads %v (fenced through %d)", rec.GetState(), rec.GetFencedThroughTry())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 2 of a call whose try 1 SUCCEEDED started: the late Fence's tombstone, written on an absence its stale reading vouched for, stayed")
}

// ownRedis starts a redis-server of the test's own, on a port the kernel
// picked, and returns its address and process; it is killed at cleanup.
// args are added to its command line.
func ownRedis(t *testing.T, args ...string) (string, *ownServer) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "no redis-server binary: "+err.Error())
	}
	// A port the kernel hands out is free when it does, but another
	// process may take it before redis-server binds it: then redis-server
	// exits, or — worse — the port answers for a server that is not this
	// test's, on which the test would pause, kill or reconfigure. So the
	// server must answer with its own process ID, or the test tries again.
	for range 10 {
		port := freePort(t)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		cmd := exec.Command(bin, append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", t.TempDir(), "--maxmemory-policy", "noeviction"}, args...)...)
		require.NoError(t, cmd.Start())
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }() // the only Wait: ownServer.Wait waits for it
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			<-exited
		}
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		own := false
		if eventually(10*time.Second, func() bool {
			select {
			case <-exited:
				return true // it could not bind: another process took the port
			default:
			}
			info := c.InfoMap(context.Background(), "server")
			own = info.Err() == nil && info.Item("Server", "process_id") == fmt.Sprint(cmd.Process.Pid)
			return info.Err() == nil
		}) && own {
			_ = c.Close()
			t.Cleanup(stop)
			return addr, &ownServer{Process: cmd.Process, exited: exited}
		}
		_ = c.Close()
		stop()
	}
	t.Fatal("no redis-server of the test's own started on a free port")
	return "", nil
}

// ownServer is a redis-server process that ownRedis started.
type ownServer struct {
	Process *os.Process
	exited  chan struct{}
}

// Wait waits for the process to exit.
func (s *ownServer) Wait() error {
	<-s.exited
	return nil
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago (the
// kernel picked it), whose port+10000 (a Cluster node's bus port, unless
// set) was free too, and that no other test of this process got
// (redisstore.OwnPortForTest).
func freePort(t *testing.T) int {
	t.Helper()
	return redisstore.OwnPortForTest(t)
}

// A review found that a Begin whose reply is lost decided between FENCED and UNKNOWN by how
// long the call took on the client (endBegun: late = s.late(read) != nil),
// but a script that was sent may run much later than the client gave up:
// here Redis stalls (SIGSTOP, as a long fork, swap or VM pause would), the
// Begin's context ends after 150 ms — within the keep — so the lost-reply
// fence is FENCED, not UNKNOWN. When Redis goes on, it runs the Begin's
// script first with its stale reading: the SUCCEEDED record has been
// removed by its TTL, the reading vouches for its absence, try 2 begins;
// then the fence, which the Begin token now lets end the try: FENCED(2).
// Try 3 of the call that SUCCEEDED begins: its handler runs again.
func TestStoreStalledLostReplyFenceTombstonesSucceededCall(t *testing.T) {
	addr, proc := ownRedis(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 4})
	t.Cleanup(func() { _ = c.Close() })
	plain := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = plain.Close() })
	p := idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
		MaxAttemptDeadline: 3 * time.Second, TTL: 3200 * time.Millisecond, MaxResponseBytes: 1024}
	s, err := redisstore.New(context.Background(), c, redisstore.WithPrefix("review:"), redisstore.WithPolicy(p),
		hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	// The tenant's horizon starts, then k is minted skew ahead: inside it.
	_, err = s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(0), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err)
	afterHorizon()
	k := idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(p.Skew), Call: "0", Method: "/x.Y/Z"}
	ts, _ := idempotency.AttemptTime(k.AttemptID)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))
	rk := recordKey("review:", k)
	pttl := plain.PTTL(ctx, rk).Val()
	gone := time.Now().Add(pttl)

	// The pool holds several open connections (a busy server's would).
	conns := make([]*redis.Conn, 3)
	for i := range conns {
		conns[i] = c.Conn()
		require.NoError(t, conns[i].Ping(ctx).Err())
	}
	for _, cn := range conns {
		require.NoError(t, cn.Close()) // back to the pool, open
	}
	// Shortly before absence stops being evidence, Redis stalls.
	time.Sleep(time.Until(ts.Add(-p.Skew + p.TTL - 250*time.Millisecond)))
	require.NoError(t, proc.Process.Signal(syscall.SIGSTOP))
	bctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	_, err = s.Begin(bctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(2 * time.Second)})
	cancel()
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	time.Sleep(time.Until(gone) + 500*time.Millisecond) // the SUCCEEDED record's TTL ends during the stall
	require.NoError(t, proc.Process.Signal(syscall.SIGCONT))

	time.Sleep(200 * time.Millisecond)
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	t.Logf("after the stall the key reads %v (try %d, fenced through %d)", rec.GetState(), rec.GetTry(), rec.GetFencedThroughTry())
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 3, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 3 of a call whose try 1 SUCCEEDED started: the lost-reply fence tombstoned the try a stalled, stale Begin script began")
}

// A review suspected that a fence over a tombstone can shorten the
// tombstone's life: the fence script rewrites exp as its own reading plus
// the TTL, which is earlier than the exp written by a server whose clock is
// ahead (or whose TTL is longer). With one policy on every replica, as
// WithPolicy requires, that is harmless: every write sets exp at least the
// TTL past its own reading, and a script writes only for an attempt created
// at most the skew after its reading, so exp >= attempt time - skew + TTL,
// and a server whose clock reads the tombstone expired also reads the
// attempt past its TTL: it answers UNKNOWN and starts no try, never UNSEEN.
// Here server a, a skew ahead of b, fences; b raises the ballot and moves
// exp a skew earlier; at that exp, by a's clock and then by b's, Get
// answers UNKNOWN, Fence UNKNOWN, and no try starts. (Replicas with
// different policies are another matter: a longer TTL reads any record
// another replica let expire as absent; see WithPolicy.)
func TestFenceOverTombstoneShortensItHarmlessly(t *testing.T) {
	c, prefix := newClient(t)
	p := storetest.Policy()
	base := time.Now().Add(storetest.ClockLead)
	cb := storetest.NewClock(base)
	ca := storetest.NewClock(base.Add(p.Skew))
	a := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(ca))
	b := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(cb))
	ctx := context.Background()
	_, err := b.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(base), Call: "h", Method: "/x.Y/Z"}) // the horizon starts
	require.NoError(t, err)
	adv := func(d time.Duration) { ca.Advance(d); cb.Advance(d) }
	// The horizon lies at b's reading, or past it at Redis's TIME when the
	// machine took longer than the lead to get here (a loaded machine):
	// both clocks move on past it then (see startHorizon).
	if behind := time.Now().Truncate(time.Millisecond).Add(storetest.ClockLead).Sub(cb.Now()); behind > 0 {
		adv(behind)
	}
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(cb.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	adv(time.Millisecond)

	rk := recordKey(prefix, k)
	rec, err := a.Fence(ctx, k, 1)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	first, err := c.HGet(ctx, rk, "exp").Int64()
	require.NoError(t, err)
	rec, err = b.Fence(ctx, k, 2)
	require.NoError(t, err)
	require.Equal(t, uint32(2), rec.GetFencedThroughTry())
	exp, err := c.HGet(ctx, rk, "exp").Int64()
	require.NoError(t, err)
	require.Equal(t, first-p.Skew.Milliseconds(), exp, "b's fence moved the tombstone's expiry a skew earlier")

	for _, at := range []struct {
		name  string
		clock *storetest.Clock
	}{{"a", ca}, {"b", cb}} {
		adv(time.UnixMilli(exp).Sub(at.clock.Now())) // the tombstone reads expired by at's clock
		for _, srv := range []struct {
			name  string
			s     *redisstore.Store
			clock *storetest.Clock
		}{{"a", a, ca}, {"b", b, cb}} {
			rec, err := srv.s.Get(ctx, k)
			require.NoError(t, err)
			if srv.name == "b" && at.name == "a" {
				// By b's clock, a skew behind, the tombstone still stands.
				require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
				continue
			}
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(),
				"%s at the expiry by %s's clock: the tombstone's absence read as evidence", srv.name, at.name)
			for _, try := range []uint32{1, 2} {
				res, err := srv.s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: try, Deadline: srv.clock.Now().Add(time.Second)})
				require.NoError(t, err)
				require.False(t, res.Started, "%s at the expiry by %s's clock: fenced try %d started", srv.name, at.name, try)
				require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal)
			}
			rec, err = srv.s.Fence(ctx, k, 2)
			require.NoError(t, err)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())
		}
	}
}

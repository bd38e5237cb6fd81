package redisstore_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
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

// A review found that a store call read the server's clock (now) before it
// sent its script, and the script judged the record by that now ("exp <=
// now" for a record that has expired, "now < ts - skew + ttl" for an
// absence it may vouch for), while Redis removed the record by its own TTL,
// in real time, exactly exp - now after the last write. A call whose script
// ran later than it read the clock (it waited for a pooled connection, as
// here; or go-redis resent it after a lost reply, with the same arguments)
// found the record already gone while its stale now still vouched for the
// absence: Begin started the try of a call that had SUCCEEDED again — the
// handler ran twice for one record key (DESIGN.md §3.7). Redis now keeps a
// record DefaultKeep past its expiry, and a call whose reply comes later
// than that fails instead of acting on what it judged.
//
// The only artifice here is a small policy (TTL 1.2 s) so that the record
// expires during the test; the clock is the real one, the delay a real wait
// for the client's only pooled connection.
func TestRedisStaleNowResurrectsExpiredRecord(t *testing.T) {
	t.Run("within the keep", func(t *testing.T) {
		_, plain, held, rk, begin := staleBegin(t, nil)
		// Hold the connection until the record is past its expiry.
		exp, err := plain.HGet(t.Context(), rk, "exp").Int64()
		require.NoError(t, err)
		time.Sleep(time.Until(time.UnixMilli(exp)) + 50*time.Millisecond)
		require.EqualValues(t, 1, plain.Exists(t.Context(), rk).Val(), "Redis keeps the record past its expiry")
		require.NoError(t, held.Close()) // the connection is free again
		o := <-begin
		require.NoError(t, o.err)
		require.False(t, o.res.Started,
			"try 2 started although try 1 SUCCEEDED: its stale now vouched for an expired record's absence (refusal %v)", o.res.Refusal)
		require.Equal(t, idempotency.RefusedFinished, o.res.Refusal, "judged by its reading, the record had not expired")
	})
	t.Run("later than the keep", func(t *testing.T) {
		s, plain, held, rk, begin := staleBegin(t, hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
		waitFor(t, 10*time.Second, "Redis removing the record at its expiry plus the keep", func() bool {
			return plain.Exists(t.Context(), rk).Val() == 0
		})
		require.NoError(t, held.Close())
		o := <-begin
		require.ErrorIs(t, o.err, idempotency.ErrStoreUnavailable, "a reply later than the keep is not acted on")
		require.False(t, o.res.Started)
		// The script, judging by its stale now, began the try; what the
		// key reads as now must not let the owner repeat a call that
		// SUCCEEDED (UNSEEN, FENCED, or a try in progress that would read
		// ABANDONED and then be fenced): UNKNOWN.
		rec, err := s.Get(t.Context(), idempotency.Key{Tenant: "acme", AttemptID: attemptOf(rk), Call: "0", Method: "/x.Y/Z"})
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())
	})
}

type beginOut struct {
	res idempotency.BeginResult
	err error
}

// staleBegin begins and finishes try 1 of a call on a store whose client has
// one pooled connection, takes that connection, and starts Begin of try 2,
// which reads the clock and waits for it. It returns the store, a plain
// client, the held connection (close it to let Begin go on), the record's
// key and Begin's result.
func staleBegin(t *testing.T, opt redisstore.Option) (*redisstore.Store, *redis.Client, *redis.Conn, string, chan beginOut) {
	t.Helper()
	plain, prefix := newClient(t)
	p := idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
		MaxAttemptDeadline: time.Second, TTL: 1200 * time.Millisecond, MaxResponseBytes: 1024}
	var read atomic.Int32
	readNow := make(chan struct{}, 1)
	clock := func() time.Time {
		t := time.Now()
		if read.Add(-1) == 0 {
			readNow <- struct{}{}
		}
		return t
	}
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, PoolSize: 1, PoolTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	opts := []redisstore.Option{redisstore.WithPrefix(prefix), redisstore.WithPolicy(p), hooks.RedisClock(clock).(redisstore.Option)}
	if opt != nil {
		opts = append(opts, opt)
	}
	s, err := redisstore.New(context.Background(), c, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()

	// The tenant's horizon starts, then k is minted skew ahead: inside it.
	_, err = s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(0), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err)
	afterHorizon()
	k := idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(p.Skew), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))
	rk := prefix + "{t:acme}:r|" + k.AttemptID + "|0|/x.Y/Z"

	// Another goroutine of this server holds the client's only connection
	// for a while (a slow command, a busy pool).
	held := c.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	done := make(chan beginOut, 1)
	read.Store(1)
	go func() {
		bctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := s.Begin(bctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(time.Second)})
		done <- beginOut{r, err}
	}()
	<-readNow // try 2's Begin read the clock, and waits for the connection
	return s, plain, held, rk, done
}

func attemptIDNow(ahead time.Duration) string {
	return storetest.AttemptIDAt(time.Now().Add(ahead))
}

// attemptOf returns the attempt ID in record key rk (prefix{t:tenant}:r|id|call|method).
func attemptOf(rk string) string {
	return strings.Split(rk, "|")[1]
}

// With a policy skew above DefaultKeep (a minute), the Begin script's
// staleness check (Redis's clock more than the keep less the skew past the
// call's reading) refused every try until the keep was made DefaultKeep
// plus the skew. CI's run of the interceptor's skew=1m tests found it.
func TestSkewAboveDefaultKeepStillBegins(t *testing.T) {
	c, prefix := newClient(t)
	p := storetest.Policy()
	p.Skew, p.TTL = time.Minute, 10*time.Minute
	s := newStore(t, c, prefix, redisstore.WithPolicy(p))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
}

// New refuses a Redis whose clock differs from the server's by more than
// the skew (plus a second), either way: ahead, every Begin and Fence script
// would take its call for a stale one and refuse it, and fresh attempts
// would stay unverifiable after a horizon move; behind, the staleness check
// would be off (a later review found that one).
func TestNewRefusesARedisClockFarOff(t *testing.T) {
	for _, off := range []time.Duration{-time.Minute, time.Minute} {
		c, prefix := newClient(t)
		server := func() time.Time { return time.Now().Add(off) }
		_, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), hooks.RedisClock(server).(redisstore.Option))
		require.ErrorContains(t, err, "differs from this server's", "server clock off by %v", off)
	}
}

// A review found that, while DefaultKeep's doc (and the README) said the Begin and Fence scripts'
// staleness check "assumes Redis's clock within the skew of the servers'".
// With a policy skew of a minute (as CI's interceptor tests use, and
// interceptor.WithClockSkew allows), a server whose clock is 45 s behind
// Redis's is within that assumption, yet the check (Redis's TIME minus the
// call's reading > keep - skew = DefaultKeep, c5e851f) is true for every
// call the server makes: every Begin and every Fence fails
// STORE_UNAVAILABLE, "the script ran more than 30s after its call read the
// clock", although each ran at once. The server's clock is fed through
// hooks.RedisClock; Redis is the real, local one.
func TestRecordsRedisClockWithinLargeSkewRefusesEveryBegin(t *testing.T) {
	c, prefix := newClient(t)
	p := storetest.Policy()
	p.Skew, p.TTL = time.Minute, 10*time.Minute
	behind := func() time.Time { return time.Now().Add(-45 * time.Second) } // within the skew of Redis's clock
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), hooks.RedisClock(behind).(redisstore.Option))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(behind()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: behind().Add(time.Second), Minted: true})
	require.NoError(t, err, "a Begin that ran at once, from a server whose clock is within the skew of Redis's, was refused")
	require.True(t, res.Started, "refused %v", res.Refusal)
	k.Call = "1"
	_, err = s.Fence(ctx, k, 1)
	require.NoError(t, err, "a Fence that ran at once, from a server whose clock is within the skew of Redis's, was refused")
}

// A review found that, while DefaultKeep's doc allowed a store call to run up to DefaultKeep after it
// read the clock (it waited for a pooled connection, or go-redis resent it),
// and 5655d6a has the Begin and Fence scripts write nothing when they run
// later than that. But every script, Get's included, still moves a missing
// or foreign horizon (a failover, restart or restore lost records) to its
// call's reading, however old: here server A's Get reads the clock, waits
// 1 s for its pooled connection; meanwhile server B runs call X's try 1 to
// SUCCEEDED, and Redis loses it (a failover; simulated as
// TestRedisIdentityChangeMovesHorizon does). A's Get then runs first on the
// new Redis and moves the horizon to its reading, 1 s before X's record was
// written: X lies inside the horizon, reads UNSEEN, is fenced and begun
// again. The horizon must move past every record Redis may have lost
// (DESIGN §3.8): to Redis's TIME, not to a reading that may be DefaultKeep
// old. Real clocks; skew 100 ms.
//
// A final review found the same window, narrowed to a skew, when the horizon
// moved to Redis's time less the skew: the client that minted X ran a skew
// ahead (as the skew allows). It now moves to Redis's time itself.
func TestRecordsRedisStaleReadingMovesHorizonBeforeLostRecord(t *testing.T) {
	for _, ahead := range []time.Duration{0, 100 * time.Millisecond} { // the client's clock, ahead of the servers'
		t.Run("client ahead "+ahead.String(), func(t *testing.T) { staleHorizon(t, ahead) })
	}
}

func staleHorizon(t *testing.T, ahead time.Duration) {
	plain, prefix := newClient(t)
	p := idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
		MaxAttemptDeadline: 3 * time.Second, TTL: 10 * time.Second, MaxResponseBytes: 1024}
	aClock := newArmedClock(0)
	ca := onePoolClient(t, nil)
	a := newStore(t, ca, prefix, redisstore.WithPolicy(p), hooks.RedisClock(aClock.now).(redisstore.Option))
	b := newStore(t, plain, prefix, redisstore.WithPolicy(p))
	ctx := context.Background()
	tenant := "acme"
	other := idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(time.Now()), Call: "9", Method: "/x.Y/Z"}
	_, err := b.Get(ctx, other) // the horizon starts
	require.NoError(t, err)
	time.Sleep(2 * p.Skew)

	// Server A's Get reads the clock, then waits for its only connection.
	held := ca.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	aClock.arm()
	done := make(chan error, 1)
	go func() {
		_, err := a.Get(ctx, other)
		done <- err
	}()
	<-aClock.read

	// Meanwhile server B runs call X to SUCCEEDED.
	time.Sleep(time.Second)
	x := idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(time.Now().Add(ahead)), Call: "0", Method: "/x.Y/Z"}
	res, err := b.Begin(ctx, idempotency.BeginRequest{Key: x, Try: 1, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	require.NoError(t, b.Finish(ctx, idempotency.FinishRequest{Key: x, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))

	// A failover loses X's record (it had not reached the replica).
	require.NoError(t, plain.Del(ctx, recordKey(prefix, x)).Err())
	require.NoError(t, plain.HSet(ctx, prefix+"{t:"+tenant+"}:h", "id", "0000/0000").Err())

	// A's Get runs first on the new primary.
	require.NoError(t, held.Close())
	require.NoError(t, <-done)

	rec, err := b.Get(ctx, x)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(),
		"X's record was lost in the failover, yet X reads %v", rec.GetState())
	_, err = b.Fence(ctx, x, 1)
	require.NoError(t, err)
	res, err = b.Begin(ctx, idempotency.BeginRequest{Key: x, Try: 2, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started, "try 2 of a call whose try 1 SUCCEEDED started")
}

// timeSeen is a go-redis hook that notes the nodes a TIME was sent to.
type timeSeen struct {
	addr string
	mu   *sync.Mutex
	seen map[string]bool
}

func (h timeSeen) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h timeSeen) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "time") {
			h.mu.Lock()
			h.seen[h.addr] = true
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (h timeSeen) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds { // a node check sends its TIME in a pipeline
			if strings.EqualFold(cmd.Name(), "time") {
				h.mu.Lock()
				h.seen[h.addr] = true
				h.mu.Unlock()
			}
		}
		return next(ctx, cmds)
	}
}

// A review found that New's clock check, which exists so that a Redis whose clock
// runs far ahead is refused at New "instead of a store that answers
// STORE_UNAVAILABLE to everything"; on a Cluster, every primary runs the
// scripts of its own tenants against its own TIME, and each may run another
// machine's clock. New checks maxmemory-policy and hz on every node
// (eachNode), but reads TIME from one: a ClusterClient sends a command
// without keys to a single shard. The Cluster's primaries must each have
// their clock read.
func TestRedisClusterNewReadsEveryPrimarysClock(t *testing.T) {
	_, prefix := newClusterClient(t) // skips without a Cluster; cleans the prefix
	var mu sync.Mutex
	seen := map[string]bool{}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	c.OnNewNode(func(n *redis.Client) { n.AddHook(timeSeen{addr: n.Options().Addr, mu: &mu, seen: seen}) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := redisstore.New(ctx, c, redisstore.WithPrefix(prefix))
	require.NoError(t, err)

	var masters []string
	require.NoError(t, c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, n.Options().Addr)
		return nil
	}))
	mu.Lock()
	defer mu.Unlock()
	var unchecked []string
	for _, a := range masters {
		if !seen[a] {
			unchecked = append(unchecked, a)
		}
	}
	require.Empty(t, unchecked, "New read TIME on %v only; the clocks of primaries %v were never compared with the server's", seen, unchecked)
}

// A review found that checkClock said "A Redis clock behind costs nothing" and New accepted a
// Redis whose clock lags the servers' by any amount. But the Begin and Fence
// scripts' staleness check (Redis TIME - reading > keep - skew) is weakened
// by exactly that lag: TestStoreLateFenceTombstoneLetsSucceededCallRunAgain's
// scenario, with the server's clock 10 s ahead of Redis's (skew 100 ms, the
// keep shortened to 300 ms), writes its tombstone again, and try 2 of a
// call that SUCCEEDED begins.
//
// A final review found the same with a lag New accepts (the skew plus up to
// a second): the scripts' threshold and the keep now allow for it.
func TestRedisClockBehindDisablesStaleCheck(t *testing.T) {
	for _, ahead := range []time.Duration{10 * time.Second, time.Second} { // the servers' clock; Redis's lags it
		t.Run(ahead.String(), func(t *testing.T) { redisBehind(t, ahead) })
	}
}

func redisBehind(t *testing.T, ahead time.Duration) {
	_, prefix := newClient(t)
	c := onePoolClient(t, nil)
	plain, _ := newClient(t)
	p := latePolicy
	clk := newArmedClock(ahead)
	s, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p),
		hooks.RedisClock(clk.now).(redisstore.Option), hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	if err != nil {
		t.Logf("New refused the lagging Redis: %v", err)
		return // refusing it is a fine answer
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	k, ts := succeededCall(t, s, clk.now, p.Skew)
	// The owner's FenceAttempt(1) reads the clock shortly before absence
	// stops being evidence, then waits for the only pooled connection.
	t.Logf("the late Fence answered %v", lateFence(t, s, c, plain, prefix, clk, p, k, ts))

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	t.Logf("after the late Fence the key reads %v (fenced through %d)", rec.GetState(), rec.GetFencedThroughTry())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clk.now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 2 of a call whose try 1 SUCCEEDED started: a Redis clock behind the server's disabled the Fence script's staleness check")
}

package redisstore_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
	"go.uber.org/goleak"
)

// childEnv, when set, makes the test binary act as a server process that
// begins one try and waits to be killed (TestKilledServerLeavesInProgressThenAbandoned).
const childEnv = "TOLLGATE_REDISSTORE_CHILD"

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	goleak.VerifyTestMain(m)
}

func redisAddr() string {
	if a := os.Getenv("TOLLGATE_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// newClient returns a client of the test Redis, closed at cleanup, and a
// fresh key prefix whose keys are deleted at cleanup. It skips the test when
// no Redis answers, unless TOLLGATE_REQUIRE_REDIS=1.
func newClient(t testing.TB) (*redis.Client, string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		skipOrFail(t, fmt.Sprintf("no Redis answers at %s (set TOLLGATE_REDIS_ADDR, or run scripts/ensure-redis.sh): %v", redisAddr(), err))
	}
	prefix := "tollgate-test:" + randomHex() + ":"
	t.Cleanup(func() {
		deletePrefix(t, c, prefix)
		_ = c.Close()
	})
	return c, prefix
}

// skipOrFail skips the test for want of a Redis, or fails it when
// TOLLGATE_REQUIRE_REDIS=1 (as CI sets).
func skipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("TOLLGATE_REQUIRE_REDIS") == "1" {
		t.Fatalf("%s (TOLLGATE_REQUIRE_REDIS=1)", why)
	}
	t.Skip(why)
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// deletePrefix deletes every key under prefix: a flush of this test's data
// only, leaving the shared Redis alone.
func deletePrefix(t testing.TB, c *redis.Client, prefix string) {
	require.NoError(t, deleteKeys(context.Background(), c, prefix))
}

// deleteKeys deletes every key under prefix from the one Redis behind c, key
// by key: a Cluster node refuses a DEL of keys in different slots.
func deleteKeys(ctx context.Context, c *redis.Client, prefix string) error {
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return err
	}
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Del(ctx, k)
		}
		return nil
	})
	return err
}

func clockOption(c *storetest.Clock) redisstore.Option {
	return hooks.RedisClock(c.Now).(redisstore.Option)
}

func newStore(t testing.TB, c redis.UniversalClient, prefix string, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(context.Background(), c, append([]redisstore.Option{redisstore.WithPrefix(prefix)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() }) // no node check outlives the test
	return s
}

func TestRedisStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock, p idempotency.Policy) storetest.Harness {
		c, prefix := newClient(t)
		s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
		return storetest.Harness{Store: s, Lose: func(t *testing.T) { deletePrefix(t, c, prefix) }}
	})
}

// Records carry Redis TTLs counted from their last write (and at least
// until d + skew + grace); horizon keys carry none when idle tenants'
// keys never expire (WithIdleTenantExpiry(0)).
func TestRedisRecordsCarryTTL(t *testing.T) {
	c, prefix := newClient(t)
	p := storetest.Policy()
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), redisstore.WithIdleTenantExpiry(0))
	ctx := context.Background()
	_, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"})
	require.NoError(t, err)
	afterHorizon()
	// The store reads the real clock here: an attempt minted skew ahead is
	// inside the horizon just started.
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	pttl := func() time.Duration {
		keys, err := c.Keys(ctx, prefix+"{t:acme}:r|*").Result()
		require.NoError(t, err)
		require.Len(t, keys, 1)
		d, err := c.PTTL(ctx, keys[0]).Result()
		require.NoError(t, err)
		return d
	}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	// Redis keeps a record DefaultKeep past its expiry (see DefaultKeep).
	require.InDelta(t, (p.TTL + keepOf(p)).Seconds(), pttl().Seconds(), 2)
	long := time.Now().Add(p.TTL + time.Minute)
	k.Call = "1"
	require.NoError(t, c.Del(ctx, prefix+"{t:acme}:r|"+k.AttemptID+"|0|/x.Y/Z").Err())
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: long})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.InDelta(t, time.Until(long.Add(p.Skew+p.Grace+keepOf(p))).Seconds(), pttl().Seconds(), 2)
	d, err := c.PTTL(ctx, prefix+"{t:acme}:h").Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), d)
}

// A restart, restore or failover brings a Redis with another identity: the
// horizon moves at once, and a surviving (possibly stale) record of an
// earlier attempt no longer answers.
func TestRedisIdentityChangeMovesHorizon(t *testing.T) {
	c, prefix := newClient(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	tenant := "acme"
	k := idempotency.Key{Tenant: tenant, AttemptID: startHorizon(t, s, clock, tenant), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED}))

	// As if this data had been restored into another Redis.
	hk := prefix + "{t:" + tenant + "}:h"
	require.NoError(t, c.HSet(ctx, hk, "id", "0000/0000").Err())
	clock.Advance(time.Millisecond)
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal, "the tombstone may be stale: try 2 must not start")
	id, err := c.HGet(ctx, hk, "id").Result()
	require.NoError(t, err)
	require.NotEqual(t, "0000/0000", id)
}

func TestRedisNewChecks(t *testing.T) {
	c, _ := newClient(t)
	ctx := context.Background()
	_, err := redisstore.New(ctx, c, redisstore.WithPrefix("a{b}"))
	require.ErrorContains(t, err, "prefix")
	bad := idempotency.DefaultPolicy()
	bad.TTL = time.Second
	_, err = redisstore.New(ctx, c, redisstore.WithPolicy(bad))
	require.ErrorContains(t, err, "TTL")
	_, err = redisstore.New(ctx, c, redisstore.WithReplicas(1, 0))
	require.Error(t, err)

	lax := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer lax.Close()
	_, err = redisstore.New(ctx, lax)
	require.ErrorContains(t, err, "ContextTimeoutEnabled")

	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, ContextTimeoutEnabled: true})
	defer dead.Close()
	_, err = redisstore.New(ctx, dead)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
}

// A review found that a Redis-compatible server whose INFO leaves out
// run_id or master_replid (as some managed offerings may) gave every
// script the same identity ("?/?"): a restart, a restore or a failover,
// which lose records, no longer moved the horizon, and a lost record read
// as absent. New now refuses such a server, as it refuses one that may
// evict. The server is the test Redis, whose INFO replies a hook strips of
// the field.
func TestRedisNewRefusesServerWithoutIdentity(t *testing.T) {
	for _, f := range []struct{ section, field string }{{"server", "run_id"}, {"replication", "master_replid"}} {
		t.Run(f.field, func(t *testing.T) {
			c, prefix := newClient(t)
			c.AddHook(stripInfo{field: f.field})
			ctx := context.Background()
			info, err := c.Info(ctx, f.section).Result()
			require.NoError(t, err)
			require.NotContains(t, info, f.field+":", "the hook strips the field")
			_, err = redisstore.New(ctx, c, redisstore.WithPrefix(prefix))
			require.ErrorContains(t, err, "has no "+f.field)
			require.NotErrorIs(t, err, idempotency.ErrStoreUnavailable, "a setting to change, not an outage")
		})
	}
}

// stripInfo removes the line of field from every INFO reply.
type stripInfo struct{ field string }

func (h stripInfo) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h stripInfo) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.strip(cmd)
		return err
	}
}

// ProcessPipelineHook strips the INFO replies of pipelines too: the store's
// node checks send their commands in one.
func (h stripInfo) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.strip(cmd)
		}
		return err
	}
}

func (h stripInfo) strip(cmd redis.Cmder) {
	if sc, ok := cmd.(*redis.StringCmd); ok && cmd.Name() == "info" && cmd.Err() == nil {
		var kept []string
		for line := range strings.Lines(sc.Val()) {
			if !strings.HasPrefix(line, h.field+":") {
				kept = append(kept, line)
			}
		}
		sc.SetVal(strings.Join(kept, ""))
	}
}

// New refuses a Redis that may evict keys. It runs on a Redis of its own:
// the shared one serves other packages' tests at the same time.
func TestRedisNewRefusesEvictingRedis(t *testing.T) {
	c := privateRedis(t)
	ctx := context.Background()
	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err())
	_, err := redisstore.New(ctx, c)
	require.ErrorContains(t, err, "noeviction")
}

// A review asked whether a maxmemory-policy changed after New (CONFIG SET,
// a managed service's parameter change) is noticed. It was not: New checks
// the policy once, and the scripts cannot read the configuration (CONFIG is
// not allowed in scripts). Here Redis, switched to volatile-lru after New (a
// common default of managed services), evicts the record of a call that
// SUCCEEDED — records have TTLs, horizon keys none, so a volatile policy
// evicts records only, and the horizon stayed —: the call read UNSEEN and
// its try 2 began, its handler would have run again, even after the policy
// was put back. The scripts now count Redis's evictions (INFO stats
// evicted_keys) into its identity: an eviction moves the horizon as a
// restart does, and the call reads UNKNOWN. It runs on a Redis of its own.
func TestRedisEvictionAfterNewMovesHorizon(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	const prefix = "evict:"
	// Horizon keys without an expiry (WithIdleTenantExpiry(0)), which a
	// volatile policy never evicts: the eviction count alone must move the
	// horizon. (One with an expiry may be evicted too, which moves it as well.)
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithIdleTenantExpiry(0))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: startHorizon(t, s, clock, "acme"), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")}))

	used, err := strconv.ParseInt(mustInfo(t, c, "memory", "used_memory"), 10, 64)
	require.NoError(t, err)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err())
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", fmt.Sprint(used+2<<20)).Err())
	hk, rk := horizonKey(prefix, k.Tenant), recordKey(prefix, k)
	junk := strings.Repeat("x", 64<<10)
	for i := 0; c.Exists(ctx, rk).Val() == 1; i++ {
		require.Less(t, i, 1000, "Redis evicted no record")
		// The SET that evicts the last volatile key may still not fit: OOM.
		if err := c.Set(ctx, fmt.Sprintf("junk:%d", i), junk, 0).Err(); err != nil {
			require.True(t, redis.HasErrorPrefix(err, "OOM"), "%v", err)
		}
	}
	require.Equal(t, int64(1), c.Exists(ctx, hk).Val(), "a volatile policy evicts records (they have TTLs), never horizon keys")
	// Put back, the policy does not bring the record back.
	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())

	clock.Advance(time.Millisecond)
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "the evicted record of a call that SUCCEEDED")
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal, "try 2 of a call that SUCCEEDED must not begin")

	// Attempts created after the horizon moved are vouched for again.
	clock.Advance(p.Skew)
	fresh := idempotency.Key{Tenant: k.Tenant, AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: fresh, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "%+v", res)
}

// A Redis out of memory refuses writes (noeviction): Begin and Fence answer
// ErrStoreFull, which is also ErrStoreUnavailable. It runs on a Redis of its
// own, whose maxmemory it lowers for the moment of two calls.
func TestRedisOutOfMemoryIsStoreFull(t *testing.T) {
	c := privateRedis(t)
	prefix := "oom:"
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k := idempotency.Key{AttemptID: startHorizon(t, s, clock, ""), Call: "0", Method: "/x.Y/Z"}
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	_, beginErr := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	_, fenceErr := s.Fence(ctx, k, 1)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	for _, err := range []error{beginErr, fenceErr} {
		require.ErrorIs(t, err, idempotency.ErrStoreFull)
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	}
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())
}

// A context's deadline bounds a store call even while Redis does not answer.
// CLIENT PAUSE holds every client of a Redis for 200 ms: of a private one,
// since on the shared one it would hold up every other test using it (go
// test runs packages in parallel), and a short deadline there would fail.
func TestRedisHonoursDeadline(t *testing.T) {
	c := privateRedis(t)
	s := newStore(t, c, "deadline:")
	ctx := context.Background()
	require.NoError(t, c.Do(ctx, "CLIENT", "PAUSE", 200, "ALL").Err())
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err := s.Get(short, idempotency.Key{AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, c.Do(ctx, "CLIENT", "UNPAUSE").Err())
}

// With WAIT for a replica the test Redis does not have, Begin and Fence
// answer ErrStoreUnavailable, and the begun try is fenced so its next try
// can start once replicas are back.
func TestRedisWaitForReplicas(t *testing.T) {
	c, prefix := newClient(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	waiting := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 10*time.Millisecond))
	plain := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k := idempotency.Key{AttemptID: startHorizon(t, plain, clock, ""), Call: "0", Method: "/x.Y/Z"}
	_, err := waiting.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorContains(t, err, "0 of 1 replicas")
	rec, err := plain.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	require.Equal(t, uint32(1), rec.GetFencedThroughTry())
	res, err := plain.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)

	k2 := k
	k2.Call = "1"
	_, err = waiting.Fence(ctx, k2, 1)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	// A refusal that wrote nothing still answers.
	res, err = waiting.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 3, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedInProgress, res.Refusal)
}

// The killed-server test: a child process begins a try and is killed before
// it finishes. The record reads IN_PROGRESS until the lease ends, then
// ABANDONED — never UNSEEN — and no try of the call starts again.
func TestKilledServerLeavesInProgressThenAbandoned(t *testing.T) {
	c, prefix := newClient(t)
	p := storetest.Policy()
	// The child begins the try by the real clock: the test's clock keeps to it.
	clock := storetest.NewClock(time.Now())
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	_, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err) // the horizon starts before the attempt
	afterHorizon()
	catchUp(clock)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())
	// Far enough ahead that a slow machine still starts the child in time,
	// and beyond the policy's TTL, so the record outlives it.
	deadline := clock.Now().Add(time.Minute)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d", childEnv, prefix, k.AttemptID, deadline.UnixMilli()))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "BEGUN\n", line)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	_ = stdin.Close()

	lease := deadline.Add(p.Skew)
	clock.Advance(p.Skew)
	for _, at := range []time.Time{clock.Now(), lease.Add(-time.Millisecond)} {
		clock.Advance(at.Sub(clock.Now()))
		rec, err = s.Get(ctx, k)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState())
		for _, try := range []uint32{1, 2} {
			res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: try, Fingerprint: childFingerprint, Deadline: deadline})
			require.NoError(t, err)
			require.Equal(t, idempotency.RefusedInProgress, res.Refusal)
		}
		rec, err = s.Fence(ctx, k, 1)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState())
	}
	for _, step := range []time.Duration{time.Millisecond, p.Grace - 2*time.Millisecond} {
		clock.Advance(step)
		rec, err = s.Get(ctx, k)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, rec.GetState())
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Fingerprint: childFingerprint, Deadline: clock.Now().Add(time.Second)})
		require.NoError(t, err)
		require.False(t, res.Started)
		require.Equal(t, idempotency.RefusedAbandoned, res.Refusal)
		rec, err = s.Fence(ctx, k, 2)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, rec.GetState())
	}
	// Once the record expires (d + skew + grace, the TTL having passed), the
	// attempt is UNKNOWN: still never UNSEEN, still never run.
	clock.Advance(deadline.Add(p.Skew + p.Grace).Sub(clock.Now()))
	rec, err = s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Fingerprint: childFingerprint, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal)
}

var childFingerprint = idempotency.Fingerprint("/x.Y/Z", []byte("charge card"))

// runChild is the killed server: it begins the try with the real clock,
// says so, and waits for its parent to kill it.
func runChild(spec string) int {
	parts := strings.Split(spec, "|")
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "child: bad spec", spec)
		return 2
	}
	ms, _ := strconv.ParseInt(parts[2], 10, 64)
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	ctx := context.Background()
	s, err := redisstore.New(ctx, c, redisstore.WithPrefix(parts[0]), redisstore.WithPolicy(storetest.Policy()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	k := idempotency.Key{Tenant: "acme", AttemptID: parts[1], Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Fingerprint: childFingerprint, Deadline: time.UnixMilli(ms)})
	if err != nil || !res.Started {
		fmt.Fprintln(os.Stderr, "child: begin:", err, res.Refusal)
		return 2
	}
	// The handler's effect happens here; the process dies before Finish.
	fmt.Println("BEGUN")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// BenchmarkRedisStoreBeginFinish measures a recorded unary call against the
// test Redis: fingerprint, Begin (one round trip) and Finish with a 64-byte
// response (one round trip).
func BenchmarkRedisStoreBeginFinish(b *testing.B) {
	c, prefix := newClient(b)
	s := newStore(b, c, prefix)
	ctx := context.Background()
	// Start the tenant's horizon before the benchmark's attempt.
	if _, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}); err != nil {
		b.Fatal(err)
	}
	afterHorizon()
	id := storetest.AttemptIDAt(time.Now().Add(idempotency.DefaultPolicy().Skew))
	const method = "/shop.v1.Orders/Place"
	req := make([]byte, 128)
	resp := make([]byte, 64)
	deadline := time.Now().Add(time.Minute)
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := idempotency.Key{Tenant: "acme", AttemptID: id, Call: strconv.FormatInt(next.Add(1), 10), Method: method}
			fp := idempotency.Fingerprint(method, req)
			res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Fingerprint: fp, Deadline: deadline})
			if err != nil || !res.Started {
				b.Fatal(err, res.Refusal)
			}
			if err := s.Finish(ctx, idempotency.FinishRequest{Key: key, Try: 1, Fingerprint: fp,
				State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: resp}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// WithMaxRecordsPerTenant bounds one tenant's records as the memory
// store's does (storetest.RunPerTenantBound).
func TestRedisStorePerTenantBound(t *testing.T) {
	storetest.RunPerTenantBoundKept(t, keepOf(storetest.Policy()), func(t *testing.T, clock *storetest.Clock, p idempotency.Policy) idempotency.Store {
		c, prefix := newClient(t)
		return newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithMaxRecordsPerTenant(2))
	})
}

func TestRedisStoreRefusesANegativePerTenantBound(t *testing.T) {
	c, prefix := newClient(t)
	_, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithMaxRecordsPerTenant(-1))
	require.ErrorContains(t, err, "WithMaxRecordsPerTenant")
}

// A tenant's index of records (WithMaxRecordsPerTenant) lives as long as
// its longest-lived record, and no longer: it never outlives the records it
// counts by more than a write's TTL, and never leaves them uncounted.
func TestRedisTenantIndexFollowsItsRecords(t *testing.T) {
	c, prefix := newClient(t)
	p := storetest.Policy()
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), redisstore.WithMaxRecordsPerTenant(10))
	ctx := context.Background()
	_, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"})
	require.NoError(t, err)
	time.Sleep(p.Skew)
	afterHorizon() // the horizon starts at Redis's time, from the next millisecond
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	index := prefix + "{t:acme}:n"
	record := prefix + "{t:acme}:r|" + key.AttemptID + "|0|/x.Y/Z"
	members, err := c.ZRange(ctx, index, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{record}, members)
	recTTL, err := c.PTTL(ctx, record).Result()
	require.NoError(t, err)
	idxTTL, err := c.PTTL(ctx, index).Result()
	require.NoError(t, err)
	require.Positive(t, recTTL)
	// The index counts a record until Redis removes it, DefaultKeep after
	// its expiry.
	require.GreaterOrEqual(t, idxTTL, recTTL-time.Second, "the index lives as long as its record")
	require.LessOrEqual(t, idxTTL, p.TTL+p.Skew+p.Grace+keepOf(p)+time.Second)
	// Without the bound, no index is kept.
	plain := newStore(t, c, prefix+"plain:", redisstore.WithPolicy(p))
	res, err = plain.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Deadline: time.Now().Add(time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started)
	n, err := c.Exists(ctx, prefix+"plain:{t:acme}:n").Result()
	require.NoError(t, err)
	require.Zero(t, n)
}

// keepOf is how long a store with policy p keeps records past their expiry
// (redisstore.DefaultKeep's doc): DefaultKeep, twice the skew and a second.
func keepOf(p idempotency.Policy) time.Duration {
	return redisstore.DefaultKeep + 2*p.Skew + time.Second
}

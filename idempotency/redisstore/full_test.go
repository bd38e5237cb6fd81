package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
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

// privateRedis starts a redis-server of this test's own on a free port
// (so that its maxmemory can be changed without disturbing the shared one)
// and returns a client of it; both end at cleanup.
func privateRedis(t *testing.T) *redis.Client {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "no redis-server binary: "+err.Error())
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	cmd := exec.Command(path, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--maxmemory-policy", "noeviction")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	for i := 0; ; i++ {
		if c.Ping(context.Background()).Err() == nil {
			return c
		}
		require.Less(t, i, 200, "the private redis-server did not start")
		time.Sleep(10 * time.Millisecond)
	}
}

// A full Redis (noeviction, used memory over maxmemory) must refuse new
// tries, not the end of one already running: a started try that succeeded
// is recorded SUCCEEDED (its response not kept, as FinishRequest.Response
// says of a response "the store has no room for"), with its units, as the
// memory store does. Redis refuses the finish script's HSET instead: Finish
// fails with ErrStoreFull, the record stays IN_PROGRESS until its lease
// ends and then reads ABANDONED, so the owner ends the call UNKNOWN and the
// units stay held.
func TestFullRedisStillFinishesRunningTry(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, "r63:", redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: startHorizon(t, s, clock, "acme"), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)

	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err()) // Redis is full
	finishErr := s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok"), UnitsSpent: 3})
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.NoError(t, finishErr, "a full store refused the finish of a running try; record now %v", rec.GetState())
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.Equal(t, int64(3), rec.GetUnitsSpent())
}

// A full Redis must refuse new tries and new tombstones (invariant 7: "a
// full store refuses new tries"). Redis refuses only a script's *first*
// write under OOM (scriptVerifyOOM skips the check once SCRIPT_WRITE_DIRTY
// is set, and any CMD_WRITE command sets it, whether or not it changed
// anything). With WithMaxRecordsPerTenant, room() sends ZREMRANGEBYSCORE
// before the record's HSET, so that HSET is never the first write: every
// Begin and Fence of a new record is written past maxmemory.
func TestFullRedisRefusesNewTriesWithPerTenantBound(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, "r71oom:", redisstore.WithPolicy(p), clockOption(clock), redisstore.WithMaxRecordsPerTenant(100))
	ctx := context.Background()
	key := func(call string) idempotency.Key {
		return idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: call, Method: "/x.Y/Z"}
	}
	startHorizon(t, s, clock, "acme")
	k0 := key("0")
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k0, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)

	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err()) // Redis is full
	k1 := idempotency.Key{Tenant: "acme", AttemptID: k0.AttemptID, Call: "1", Method: k0.Method}
	res, beginErr := s.Begin(ctx, idempotency.BeginRequest{Key: k1, Try: 1, Deadline: clock.Now().Add(time.Second)})
	k2 := idempotency.Key{Tenant: "acme", AttemptID: k0.AttemptID, Call: "2", Method: k0.Method}
	_, fenceErr := s.Fence(ctx, k2, 1)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())

	rec1, err := s.Get(ctx, k1)
	require.NoError(t, err)
	rec2, err := s.Get(ctx, k2)
	require.NoError(t, err)
	require.ErrorIs(t, beginErr, idempotency.ErrStoreFull,
		"Begin of a new record on a full Redis: started=%v, record now %v", res.Started, rec1.GetState())
	require.ErrorIs(t, fenceErr, idempotency.ErrStoreFull, "Fence of an absent record on a full Redis: record now %v", rec2.GetState())
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec1.GetState())
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec2.GetState())
}

// Control: the same without the bound is refused, as it should be.
func TestFullRedisRefusesNewTriesWithoutBound(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, "r71oom0:", redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k0 := idempotency.Key{Tenant: "acme", AttemptID: startHorizon(t, s, clock, "acme"), Call: "0", Method: "/x.Y/Z"}
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	_, beginErr := s.Begin(ctx, idempotency.BeginRequest{Key: k0, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	require.ErrorIs(t, beginErr, idempotency.ErrStoreFull)
}

// A full Redis refuses a new try, and the refused script writes nothing
// (its first write, horizon()'s HSET for a tenant without a horizon key, is
// the one Redis refuses). But Begin takes the OOM error as "may have run"
// and sends the fence of the try it began (endBegun); that finish is refused for OOM too, and
// Store.finish then resends it as finishFullScript (allow-oom), whose
// horizon() writes the tenant's horizon key past maxmemory. A refused new
// try of a tenant Redis has not seen leaves a key behind on a full Redis:
// the allow-oom variant's first write is not the record's (it finishes
// nothing here: there is no record).
func TestRefusedBeginWritesNothingOnFullRedis(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, "r83oomh:", redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "newtenant", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}

	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err()) // Redis is full
	_, beginErr := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second), Minted: true})
	keys, kerr := c.Keys(ctx, "r83oomh:*").Result()
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	require.NoError(t, kerr)

	require.ErrorIs(t, beginErr, idempotency.ErrStoreFull)
	require.Empty(t, keys, "a Begin refused for want of memory left keys written past maxmemory")
}

// A review found that, once Redis kept every record DefaultKeep past its
// expiry, the tenant's index (and so WithMaxRecordsPerTenant's bound)
// counted records only until their expiry: a tenant that filled its bound
// again each time its records expired held up to (1 + DefaultKeep/TTL)
// times the bound in Redis. The index now counts a record until Redis
// removes it: the tenant is refused while its expired records are kept,
// and has room once Redis removed them. Real clock; the keep is shortened
// to 300 ms.
func TestRecordsTenantBoundIgnoresKeptRecords(t *testing.T) {
	plain, prefix := newClient(t)
	p := idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
		MaxAttemptDeadline: time.Second, TTL: 1200 * time.Millisecond, MaxResponseBytes: 1024}
	const bound = 2
	const keep = 300 * time.Millisecond
	s := newStore(t, plain, prefix, redisstore.WithPolicy(p), redisstore.WithMaxRecordsPerTenant(bound),
		hooks.RedisKeep(keep).(redisstore.Option))
	ctx := context.Background()
	_, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(0), Call: "0", Method: "/x.Y/Z"})
	require.NoError(t, err) // the tenant's horizon starts
	time.Sleep(2 * p.Skew)

	records := func() int {
		keys, err := plain.Keys(ctx, prefix+"{t:acme}:r|*").Result()
		require.NoError(t, err)
		return len(keys)
	}
	for round := range 3 {
		id := attemptIDNow(0)
		for i := range bound {
			_, err := s.Fence(ctx, idempotency.Key{Tenant: "acme", AttemptID: id, Call: fmt.Sprint(i), Method: "/x.Y/Z"}, 1)
			require.NoError(t, err, "round %d: the tenant has room again once Redis removed its records", round)
		}
		require.LessOrEqual(t, records(), bound, "round %d", round)
		time.Sleep(p.TTL + 100*time.Millisecond) // every record of the round past its expiry, still kept
		_, err := s.Fence(ctx, idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(0), Call: "x", Method: "/x.Y/Z"}, 1)
		require.ErrorIs(t, err, idempotency.ErrStoreFull, "round %d: the kept records still count", round)
		waitFor(t, 10*time.Second, "Redis removing the round's records", func() bool { return records() == 0 })
	}
}

// A review found that New accepted a WithReplicas timeout longer than
// DefaultKeep (with a long ReadTimeout): every Begin whose WAIT took that
// long was then refused as late, and its try ended UNKNOWN for good. New
// now refuses a timeout that leaves less than half the keep.
func TestReplicasTimeoutMustLeaveHalfTheKeep(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, ReadTimeout: 2 * time.Minute})
	t.Cleanup(func() { _ = c.Close() })
	_, err := redisstore.New(context.Background(), c, redisstore.WithReplicas(1, 20*time.Second))
	require.ErrorContains(t, err, "DefaultKeep")
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestFullRedisStillAnswersACoveredFence: since 1a66bd6 a Fence whose
// ballot an existing tombstone already covers rewrites the tombstone's
// "fen" field (so that WAIT covers a resent first run). That HSET is the
// script's first write, and a full Redis (noeviction, over maxmemory)
// refuses it: the fence that used to answer FENCED, writing nothing, now
// fails with ErrStoreFull. An owner resolving a lost try that its server
// tombstoned (a refusal without effect) then ends UNKNOWN instead of
// repeating: a full store must refuse new tries, not answers about old
// ones (DESIGN.md §3.7).
func TestFullRedisStillAnswersACoveredFence(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, "rv5:", redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: startHorizon(t, s, clock, "acme"), Call: "0", Method: "/x.Y/Z"}
	rec, err := s.Fence(ctx, k, 2)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())

	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err()) // Redis is full
	rec, fenceErr := s.Fence(ctx, k, 1)                          // covered by the tombstone through 2
	rec2, fenceErr2 := s.Fence(ctx, k, 2)                        // the same ballot again (a resend)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())

	require.NoError(t, fenceErr, "a fence the tombstone covers, on a full Redis")
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	require.NoError(t, fenceErr2, "the same ballot again, on a full Redis")
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec2.GetState())
}

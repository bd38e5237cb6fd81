package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A horizon key's field "last" (when a record a store with
// WithIdleTenantExpiry(0) wrote is gone) that the store cannot have written
// is an error, as a bad "at" is: the store cannot tell how long the key must
// live. hold() read and checked it only when it mattered (a store with idle
// expiry, or a record past LONGEST), and only after the script had written
// its record: a Begin started its try (and a Fence wrote its tombstone)
// and then answered ErrStoreUnavailable, leaving the tenant's index without
// the record; a store with 0 answered Get and short tries as if the key
// were sound. Every call of the tenant must fail, before writing anything,
// whatever the store's idle expiry.
func TestR15BadLastIsAnErrorBeforeAnyWrite(t *testing.T) {
	p := idlePolicy()
	for _, idle := range []time.Duration{0, shortIdle} {
		for _, last := range []string{"garbage", "", "-5", "0", "1.5", "1e3", " 1700000000000", "0x10", "inf", "9999999999999999", "1", "1704067199999"} {
			t.Run(fmt.Sprintf("idle %v last %q", idle, last), func(t *testing.T) {
				c, prefix := newClient(t)
				s := newStore(t, c, prefix, redisstore.WithPolicy(p), redisstore.WithIdleTenantExpiry(idle),
					redisstore.WithMaxRecordsPerTenant(10), hooksKeep())
				ctx := context.Background()
				hk := horizonKey(prefix, "acme")
				lookUp(t, s, "acme")
				time.Sleep(p.Skew + 2*time.Millisecond)
				require.NoError(t, c.HSet(ctx, hk, "last", last).Err()) // its identity stays this Redis's
				ttl := pttl(t, c, hk)

				k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
				rec, err := s.Get(ctx, k)
				require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "Get answered %v", rec.GetState())
				rec, err = s.Fence(ctx, k, 1)
				require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "Fence answered %v", rec.GetState())
				res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(400 * time.Millisecond)})
				require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "Begin answered started %v, refusal %v", res.Started, res.Refusal)
				long := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "1", Method: "/x.Y/Z"}
				res, err = s.Begin(ctx, idempotency.BeginRequest{Key: long, Try: 1, Deadline: time.Now().Add(4 * time.Second)})
				require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a long try's Begin answered started %v, refusal %v", res.Started, res.Refusal)
				minted := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "2", Method: "/x.Y/Z"}
				res, err = s.Begin(ctx, idempotency.BeginRequest{Key: minted, Try: 1, Deadline: time.Now().Add(4 * time.Second), Minted: true})
				require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a minted Begin answered started %v, refusal %v", res.Started, res.Refusal)

				for _, key := range []idempotency.Key{k, long, minted} {
					require.Zero(t, c.Exists(ctx, recordKey(prefix, key)).Val(), "a record was written beside the last %q", last)
				}
				require.Equal(t, last, c.HGet(ctx, hk, "last").Val(), "the key's last was rewritten")
				if ttl < 0 {
					require.Equal(t, ttl, pttl(t, c, hk), "the key was given an expiry")
				}
			})
		}
	}
}

// A horizon key written by another Redis (a restart, a failover) is
// rewritten as this Redis's, its horizon moved to now; whatever it held in
// "last" was about records from before the move, which no call inside the
// new horizon reads. It must not make the tenant's calls fail once the
// key is this Redis's (it would, for ever, as the store itself adopted
// it), and it must not fail the call that rewrote it after that call wrote
// its record.
func TestR15LastOfAnotherRedisIsNoError(t *testing.T) {
	p := idlePolicy()
	for _, idle := range []time.Duration{0, shortIdle} {
		t.Run(fmt.Sprint("idle ", idle), func(t *testing.T) {
			c, prefix := newClient(t)
			s := newStore(t, c, prefix, redisstore.WithPolicy(p), redisstore.WithIdleTenantExpiry(idle), hooksKeep())
			ctx := context.Background()
			hk := horizonKey(prefix, "acme")
			require.NoError(t, c.HSet(ctx, hk, "at", "1704067200000", "id", "0000/0000", "last", "garbage").Err())

			// A minted attempt begins at once after the move, and lives past
			// LONGEST: its record's Begin reads the key's last.
			k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
			res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(4 * time.Second), Minted: true})
			require.NoError(t, err)
			require.True(t, res.Started, "refused %v", res.Refusal)
			require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, Minted: true,
				State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")}))
			lookUp(t, s, "acme")
			last, err := c.HGet(ctx, hk, "last").Int64()
			require.NoError(t, err, "the key of this Redis holds a last the store cannot have written")
			require.Greater(t, last, time.Now().Add(-time.Minute).UnixMilli())
			if idle == 0 {
				require.Equal(t, time.Duration(-1), pttl(t, c, hk))
			} else {
				require.GreaterOrEqual(t, pttl(t, c, hk), pttl(t, c, recordKey(prefix, k)))
			}
		})
	}
}

// A key that another replica gave an expiry is held by a store with
// WithIdleTenantExpiry(0) as long as a record it writes lives, however long
// (a deadline further ahead than MaxAttemptDeadline), plus the second
// expire promises, compared in Redis's own clock.
func TestR15ForeverStoreHoldsAnExpiringKeyPastItsLongRecord(t *testing.T) {
	c, prefix := newClient(t)
	p := idlePolicy()
	expiring := idleStore(t, c, prefix, shortIdle)
	forever := idleStore(t, c, prefix, 0)
	hk := horizonKey(prefix, "acme")
	ctx := context.Background()

	lookUp(t, expiring, "acme")
	require.LessOrEqual(t, pttl(t, c, hk), shortIdle)
	time.Sleep(p.Skew + 2*time.Millisecond)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := forever.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(4 * time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	h, r := pttl(t, c, hk), pttl(t, c, recordKey(prefix, k))
	require.Greater(t, r, 4*time.Second)
	require.GreaterOrEqual(t, h, r+900*time.Millisecond, "the key outlives the record by the second expire promises")
	require.Empty(t, c.HGet(ctx, hk, "last").Val(), "a key with an expiry needs no last")

	// The expiring store's lookups never shorten it.
	lookUp(t, expiring, "acme")
	require.GreaterOrEqual(t, pttl(t, c, hk), h-200*time.Millisecond)
}

func hooksKeep() redisstore.Option { return hooks.RedisKeep(idleKeep).(redisstore.Option) }

// A full Redis (over maxmemory) refuses only a script's first write, and
// only a deny-oom one (HSET; PEXPIRE is not). A lookup still answers and
// still gives a key without an expiry one (hold writes no field for it),
// and the end of a running try that a store with WithIdleTenantExpiry(0)
// began with a deadline past MaxAttemptDeadline keeps what the key notes
// (last), so that a store that expires keys gives the key at least that
// long.
func TestR15FullRedisKeepsHorizonKeysOfLongRecords(t *testing.T) {
	c := privateRedis(t)
	p := idlePolicy()
	forever := newStore(t, c, "r15:", redisstore.WithPolicy(p), redisstore.WithIdleTenantExpiry(0), hooksKeep())
	expiring := newStore(t, c, "r15:", redisstore.WithPolicy(p), redisstore.WithIdleTenantExpiry(shortIdle), hooksKeep())
	hk := horizonKey("r15:", "acme")
	ctx := context.Background()

	lookUp(t, forever, "acme")
	time.Sleep(p.Skew + 2*time.Millisecond)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := forever.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(3 * time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	require.Equal(t, time.Duration(-1), pttl(t, c, hk))
	begun, err := c.HGet(ctx, hk, "last").Int64()
	require.NoError(t, err)

	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err()) // Redis is full
	time.Sleep(500 * time.Millisecond)
	finishErr := forever.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")})
	last, lastErr := c.HGet(ctx, hk, "last").Int64()
	rec, getErr := expiring.Get(ctx, k)
	left, rleft := pttl(t, c, hk), pttl(t, c, recordKey("r15:", k))
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())

	require.NoError(t, finishErr)
	require.NoError(t, lastErr)
	require.GreaterOrEqual(t, last, begun)
	require.NoError(t, getErr, "a full Redis refused a lookup")
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.False(t, rec.GetResponseRetained(), "the finish did not run as a full Redis's: this test needs it to")
	require.Positive(t, left, "the lookup gave the key no expiry")
	require.GreaterOrEqual(t, left, rleft)
}

package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A corrupted hash at a record key (its "st" not a number) must not be read
// as a record that is not there: Get and Fence must answer a record or an
// error, never (nil, nil), and Begin must not answer a refusal (here a
// request mismatch, final at the interceptor) without the record that
// caused it. The scripts' reply() puts view()'s nil into the middle of the
// reply table, Redis cuts the array at the nil, and decode takes the
// one-element reply as a kind without a record.
func TestCorruptRecordNotReadAsNothing(t *testing.T) {
	c, s, clock, k, rk := atRecordKey(t)
	ctx := context.Background()
	require.NoError(t, c.HSet(ctx, rk, "st", "garbage", "fp", "", "exp", clock.Now().Add(time.Hour).UnixMilli()).Err())

	rec, err := s.Get(ctx, k)
	require.False(t, err == nil && rec == nil, "Get answered neither a record nor an error")
	rec, err = s.Fence(ctx, k, 1)
	require.False(t, err == nil && rec == nil, "Fence answered neither a record nor an error")
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	if err == nil {
		require.False(t, res.Started)
		require.NotNil(t, res.Record, "Begin refused the try (%v) with no record", res.Refusal)
	}
}

// atRecordKey returns a store and the key of a record inside its tenant's
// horizon, with the Redis key that record would have: a test writes a hash
// there that the store did not write.
func atRecordKey(t *testing.T) (*redis.Client, *redisstore.Store, *storetest.Clock, idempotency.Key, string) {
	c, prefix := newClient(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	k := idempotency.Key{Tenant: "acme", AttemptID: startHorizon(t, s, clock, "acme"), Call: "0", Method: "/x.Y/Z"}
	return c, s, clock, k, prefix + "{t:acme}:r|" + k.AttemptID + "|0|/x.Y/Z"
}

// load() says a hash at a record key that is not a record this store wrote
// ("a field missing, a number that does not read, a state no record
// holds") is an error and "must never read as an absent record". Its field
// checks run only after `if not v[1] then return nil end`: a hash whose
// "st" field is missing (a record whose state was HDEL'd, a foreign hash)
// reads as no record at all. Get answers UNSEEN — absence as evidence of a
// key that holds data — and Begin starts a try over it, merging its own
// fields into the foreign hash.
func TestHashWithoutStateNotReadAsAbsent(t *testing.T) {
	c, s, clock, k, rk := atRecordKey(t)
	ctx := context.Background()
	// Every field of a FAILED record but its state.
	require.NoError(t, c.HSet(ctx, rk, "fp", "", "try", "1", "fen", "0", "code", "9", "msg", "m", "det", "",
		"resp", "", "ret", "0", "units", "3", "sa", clock.Now().UnixMilli(), "fa", clock.Now().UnixMilli(), "lease", "0",
		"dl", clock.Now().Add(time.Second).UnixMilli(), "exp", clock.Now().Add(time.Hour).UnixMilli()).Err())

	rec, err := s.Get(ctx, k)
	require.False(t, err == nil && rec.GetState() == tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN,
		"Get read a hash without its state as no record: UNSEEN")
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.False(t, err == nil && res.Started, "Begin started a try over a hash without its state")
}

// A review found that load() promised that a hash at a record key that this store did not
// write — "a number that does not read" among them — is an error, never a
// refusal. It checks numbers with Lua's tonumber, which reads "inf", "nan",
// "0x10" and "1e3", none of which the store writes (n() formats %d) and
// none of which decode's strconv.ParseInt reads. A foreign hash whose lease
// and expiry are "inf" is taken for a try IN_PROGRESS for ever: every Begin
// of the key is refused ATTEMPT_IN_PROGRESS, with a record that has no
// lease (decode read "inf" as 0), instead of failing.
func TestRedisForeignNumberReadAsRecord(t *testing.T) {
	c, s, clock, k, rk := atRecordKey(t)
	ctx := context.Background()
	require.NoError(t, c.HSet(ctx, rk, "st", "2", "fp", "", "try", "1", "fen", "0", "code", "0", "msg", "", "det", "",
		"resp", "", "ret", "0", "units", "0", "sa", "0", "fa", "0", "lease", "inf",
		"dl", "0", "exp", "inf").Err())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.Error(t, err, "a foreign hash answered as a refusal: %v, record %v", res.Refusal, res.Record)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// load() promises that a hash at a record key that this store did not
// write — "a number not written as n() writes it … Go's reader none of
// them" — is an error, never a refusal (the fix of
// TestRegression14RedisForeignNumberReadAsRecord). Its check is the pattern
// '^%-?%d+$', which also takes a number of 20 digits: Lua reads it as a
// double (1e20), Go's strconv.ParseInt (decode's num) cannot read it and
// makes it 0. A foreign hash whose lease and expiry are such numbers is
// again a try IN_PROGRESS for ever, answered with a record without a lease.
func TestRedisOverlongNumberReadAsRecord(t *testing.T) {
	c, s, clock, k, rk := atRecordKey(t)
	ctx := context.Background()
	const big = "99999999999999999999" // 20 digits: beyond int64
	require.NoError(t, c.HSet(ctx, rk, "st", "2", "fp", "", "try", "1", "fen", "0", "code", "0", "msg", "", "det", "",
		"resp", "", "ret", "0", "units", "0", "sa", "0", "fa", "0", "lease", big,
		"dl", "0", "exp", big).Err())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.Error(t, err, "a foreign hash answered as a refusal: %v, record %v", res.Refusal, res.Record)
}

// A number that both Lua and Go read but that is out of its field's range
// (a try beyond uint32, a code beyond int32, a timestamp past the year 9999)
// is an error too, never a wrapped value read as a record.
func TestRecordFieldOutOfRangeIsAnError(t *testing.T) {
	for field, value := range map[string]string{"try": "99999999999", "code": "-99999999999", "sa": "9999999999999999"} {
		t.Run(field, func(t *testing.T) {
			c, s, clock, k, rk := atRecordKey(t)
			ctx := context.Background()
			fields := map[string]string{"st": "2", "fp": "", "try": "1", "fen": "0", "code": "0", "msg": "", "det": "",
				"resp": "", "ret": "0", "units": "0", "sa": "0", "fa": "0",
				"lease": "0", "dl": "0", "exp": "0"}
			fields["lease"] = fmt.Sprint(clock.Now().Add(time.Hour).UnixMilli())
			fields["exp"] = fields["lease"]
			fields[field] = value
			require.NoError(t, c.HSet(ctx, rk, fields).Err())
			res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a foreign hash answered as a refusal: %v, record %v", res.Refusal, res.Record)
		})
	}
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestFarDeadlineRecordStaysReadable: since 2311ea4 decode refuses a
// lease_expires_at past the year 9999. BeginRequest takes any non-zero
// deadline, and the begin script writes the lease (d + skew) as it is and
// answers "started": the store writes a record it can then never read back
// (every Get, Fence and later Begin of the call fails ErrStoreUnavailable),
// where the memory store answers it. A store must either refuse the Begin
// or read what it wrote.
func TestFarDeadlineRecordStaysReadable(t *testing.T) {
	c, prefix := newClient(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: startHorizon(t, s, clock, "acme"), Call: "0", Method: "/x.Y/Z"}
	far := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	_, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: far})
	require.ErrorIs(t, err, idempotency.ErrMalformedKey, "a deadline no record can carry is refused")
	rec, err := s.Get(ctx, k)
	require.NoError(t, err, "nothing unreadable was written")
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())
}

// A tenant's horizon key of this Redis whose "at" is not a time this store
// writes (digits, from 1 ms to the year 9999) is an error for every call, as
// a hash at a record key that is not a record is: a store that cannot read
// its horizon cannot tell which absences are evidence. horizon() returned
// Lua's tonumber of any such value: a negative, zero, fractional,
// hexadecimal, exponent or space-led one, or "-inf", read as a horizon
// before the attempt, so Get answered UNSEEN and Fence wrote a tombstone on
// the strength of it, and Begin started the try; one tonumber cannot read
// made inside() compare nil, an error, except for an attempt the server
// minted, which skips that comparison and began; and "inf", "nan" or a time
// past the year 9999 refused every attempt as unverifiable until then. A
// later review found that the lower bound was 1 ms after the epoch: a
// horizon of 1, or of any time before the store existed (it writes Redis's
// TIME or later, and New checks Redis's clock), was still read as one and
// vouched for every absence since.
func TestCorruptHorizonIsAnError(t *testing.T) {
	for name, at := range map[string]string{
		"empty":              "",
		"foreign":            "garbage",
		"negative":           "-5",
		"zero":               "0",
		"one millisecond":    "1",
		"before 2024":        "1704067199999",
		"minus infinity":     "-inf",
		"infinity":           "inf",
		"nan":                "nan",
		"hexadecimal":        "0x10",
		"exponent":           "1e3",
		"fractional":         "1.5",
		"leading space":      " 1700000000000",
		"past the year 9999": "253402300800000",
		"overlong":           "99999999999999999999",
	} {
		t.Run(name, func(t *testing.T) {
			c, s, clock, k, rk := atRecordKey(t)
			ctx := context.Background()
			prefix, _, _ := strings.Cut(rk, "{")
			hk := horizonKey(prefix, k.Tenant)
			require.NoError(t, c.HSet(ctx, hk, "at", at).Err()) // its identity stays this Redis's

			rec, err := s.Get(ctx, k)
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "Get answered %v on the horizon %q", rec.GetState(), at)
			rec, err = s.Fence(ctx, k, 1)
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "Fence answered %v on the horizon %q", rec.GetState(), at)
			res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "Begin answered started %v, refusal %v on the horizon %q",
				res.Started, res.Refusal, at)
			minted := idempotency.Key{Tenant: k.Tenant, AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: k.Method}
			res, err = s.Begin(ctx, idempotency.BeginRequest{Key: minted, Try: 1, Deadline: clock.Now().Add(time.Second), Minted: true})
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a minted attempt's Begin answered started %v, refusal %v on the horizon %q",
				res.Started, res.Refusal, at)
			require.Zero(t, c.Exists(ctx, rk).Val(), "a record was written on the horizon %q", at)
			require.Equal(t, at, c.HGet(ctx, hk, "at").Val(), "the horizon was rewritten")
		})
	}
}

// A record's "exp" that the store cannot have written (every writing
// script sets it to at least its reading plus the TTL, and only inside
// ts <= now + skew, so exp >= ts - skew + ttl always) reads as an expired
// record, that is as no record: a review found Get answering UNSEEN and
// Begin starting the try of a call that SUCCEEDED. load() promises that a
// hash that is not a record this store wrote is an error, never an absent
// record.
func TestCorruptExpiryIsNotReadAsAbsent(t *testing.T) {
	for _, exp := range []string{"0", "1", "-5"} {
		t.Run(exp, func(t *testing.T) {
			c, s, clock, k, rk := atRecordKey(t)
			ctx := context.Background()
			res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
			require.NoError(t, err)
			require.True(t, res.Started)
			require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
				State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("done")}))
			require.NoError(t, c.HSet(ctx, rk, "exp", exp).Err()) // the record is still there, its TTL untouched

			rec, err := s.Get(ctx, k)
			require.False(t, err == nil && rec.GetState() == tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN,
				"Get read a SUCCEEDED record whose exp is %q as no record: UNSEEN", exp)
			res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
			require.False(t, err == nil && res.Started, "Begin started try 2 of a call that SUCCEEDED (exp %q)", exp)
		})
	}
}

// A tombstone's "fen" below 1 is one no script writes (FenceAttempt's
// through and a FENCED finish's try are at least 1): read as it stands, the
// tombstone FENCED(1) of a ballot stops no try, and the late try 1 whose
// absence the ballot was cast on starts.
func TestCorruptTombstoneBallotIsAnError(t *testing.T) {
	c, s, clock, k, rk := atRecordKey(t)
	ctx := context.Background()
	rec, err := s.Fence(ctx, k, 1)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	require.NoError(t, c.HSet(ctx, rk, "fen", "0").Err())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.False(t, err == nil && res.Started, "the late try 1 started over a tombstone whose ballot reads 0")
}

// Every record two servers whose clocks differ by up to the skew write, in
// any order, with clocks stepping back between calls, stays readable:
// load()'s checks of exp, fen and lease (TestCorruptExpiryIsNotReadAsAbsent,
// TestCorruptTombstoneBallotIsAnError) must never call one corrupt, which
// would fail every later call of its key (written by the review of those
// checks, which found none).
func TestSkewedServersWriteNoCorruptRecord(t *testing.T) {
	policies := map[string]idempotency.Policy{
		"suite": storetest.Policy(),
		"tiny":  {Skew: 500 * time.Millisecond, Grace: 0, MaxAttemptDeadline: time.Millisecond, TTL: 560 * time.Millisecond},
		"nograce-1ms": {Skew: 500 * time.Millisecond, Grace: 0, MaxAttemptDeadline: time.Millisecond,
			TTL: 600 * time.Millisecond},
	}
	for name, p := range policies {
		for _, off := range []time.Duration{p.Skew, -p.Skew} {
			for _, back := range []time.Duration{0, p.Skew} {
				back := back
				t.Run(name+"/"+off.String()+"/back"+back.String(), func(t *testing.T) {
					ctx := context.Background()
					c, prefix := newClient(t)
					base := time.Now()
					cb := storetest.NewClock(base)
					ca := storetest.NewClock(base.Add(off))
					a := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(ca))
					b := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(cb))
					first := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(base), Call: "0", Method: "/x.Y/Z"}
					_, err := b.Get(ctx, first) // the horizon starts
					require.NoError(t, err)
					adv := func(d time.Duration) { ca.Advance(d); cb.Advance(d) }
					// The horizon is the later of b's reading and Redis's
					// clock, which a loaded machine reads well after base:
					// both clocks move on to now, which is no earlier, so
					// that k lies after the horizon however long that took.
					adv(time.Since(base))
					k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(cb.Now().Add(p.Skew + 40*time.Millisecond)), Call: "0", Method: "/x.Y/Z"}
					adv(40 * time.Millisecond)
					if off < 0 {
						adv(-off)
						back = 0 // a clock behind by the skew stepping back leaves the skew
					}
					check := func(step string) {
						for _, s := range []*redisstore.Store{a, b} {
							_, err := s.Get(ctx, k)
							require.NoError(t, err, step)
						}
					}
					res, err := a.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: ca.Now().Add(time.Millisecond)})
					require.NoError(t, err)
					require.True(t, res.Started, "%+v", res)
					ca.Advance(-back) // the clock steps back between Begin and Finish
					require.NoError(t, a.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED}))
					check("after FENCED finish")

					_, err = b.Fence(ctx, k, 2)
					require.NoError(t, err)
					check("after fence over tombstone")
					res, err = b.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 3, Deadline: cb.Now().Add(time.Millisecond)})
					require.NoError(t, err)
					require.True(t, res.Started, "%+v", res)
					check("after begin over tombstone")
					require.NoError(t, b.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 3, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED}))
					check("after finish")
					// A fence-made tombstone, then a begin over it from the other server.
					k2 := idempotency.Key{Tenant: "acme", AttemptID: k.AttemptID, Call: "1", Method: "/x.Y/Z"}
					_, err = a.Fence(ctx, k2, 1)
					require.NoError(t, err)
					_, err = b.Fence(ctx, k2, 2)
					require.NoError(t, err)
					res, err = b.Begin(ctx, idempotency.BeginRequest{Key: k2, Try: 3, Deadline: cb.Now().Add(time.Millisecond)})
					require.NoError(t, err)
					require.True(t, res.Started, "%+v", res)
					_, err = a.Get(ctx, k2)
					require.NoError(t, err)
				})
			}
		}
	}
}

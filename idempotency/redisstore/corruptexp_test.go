package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that load() called a record's "exp" corrupt only at or
// before its own sa and fa (TestCorruptExpiryIsNotReadAsAbsent tries 0, 1
// and -5), while the bound every writing script keeps is exp >= ts - skew +
// TTL (each sets exp to at least its reading plus the TTL, and writes only
// when ts <= its reading + skew). An exp a millisecond after the record's
// finish, which no script writes, still read as an expired record, that is
// as no record, while the attempt's absence was still evidence: Get
// answered UNSEEN and Begin started try 2 of a call that SUCCEEDED, and a
// fence laid a tombstone over it.
func TestCorruptExpiryAfterFinishIsNotReadAsAbsent(t *testing.T) {
	for _, op := range []string{"get", "begin", "fence"} {
		t.Run(op, func(t *testing.T) {
			c, s, clock, k, rk := atRecordKey(t)
			ctx := context.Background()
			succeedDone(t, s, clock, k)
			fa, err := c.HGet(ctx, rk, "fa").Int64()
			require.NoError(t, err)
			// The record is still there, its TTL untouched; only exp is one
			// no script writes: past sa and fa, but before ts - skew + TTL.
			require.NoError(t, c.HSet(ctx, rk, "exp", strconv.FormatInt(fa+1, 10)).Err())
			clock.Advance(10 * time.Millisecond)

			switch op {
			case "get":
				rec, err := s.Get(ctx, k)
				require.False(t, err == nil && rec.GetState() == tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN,
					"Get read a SUCCEEDED record whose exp no script writes as no record: UNSEEN")
			case "begin":
				res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
				require.False(t, err == nil && res.Started, "Begin started try 2 of a call that SUCCEEDED")
			case "fence":
				rec, err := s.Fence(ctx, k, 1)
				require.False(t, err == nil && rec.GetState() == tollgatev1.AttemptState_ATTEMPT_STATE_FENCED,
					"Fence laid a tombstone over a call that SUCCEEDED")
			}
			require.Equal(t, "done", c.HGet(ctx, rk, "resp").Val(), "the record was overwritten")
		})
	}
}

// The bound load() checks, exp >= ts - skew + TTL, holds for every record
// the scripts write, whatever its attempt's time within the skew of the
// writer's clock: a minted attempt created a skew ahead, and one created
// long before (a far deadline).
func TestExpiryBoundHoldsForRecordsAtTheSkew(t *testing.T) {
	_, s, clock, k, _ := atRecordKey(t)
	ctx := context.Background()
	p := storetest.Policy()
	for i, ts := range []time.Time{clock.Now().Add(p.Skew), clock.Now()} {
		k.AttemptID = storetest.AttemptIDAt(ts)
		k.Call = strconv.Itoa(i)
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second), Minted: i == 0})
		require.NoError(t, err)
		require.True(t, res.Started, "refused %v", res.Refusal)
		require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, Minted: i == 0,
			State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED}))
		rec, err := s.Fence(ctx, k, 2)
		require.NoError(t, err)
		require.Equal(t, uint32(2), rec.GetFencedThroughTry())
		rec, err = s.Get(ctx, k)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	}
}

package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// load() says a hash at a record key that is not a record this store wrote
// ("a field missing, a number that does not read, a state no record
// holds") is an error and "must never read as an absent record". Its field
// checks run only after `if not v[1] then return nil end`: a hash whose
// "st" field is missing (a record whose state was HDEL'd, a foreign hash)
// reads as no record at all. Get answers UNSEEN — absence as evidence of a
// key that holds data — and Begin starts a try over it, merging its own
// fields into the foreign hash.
func TestRegression13cHashWithoutStateNotReadAsAbsent(t *testing.T) {
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

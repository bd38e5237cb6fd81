package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// A corrupted hash at a record key (its "st" not a number) must not be read
// as a record that is not there: Get and Fence must answer a record or an
// error, never (nil, nil), and Begin must not answer a refusal (here a
// request mismatch, final at the interceptor) without the record that
// caused it. The scripts' reply() puts view()'s nil into the middle of the
// reply table, Redis cuts the array at the nil, and decode takes the
// one-element reply as a kind without a record.
func TestRegression13CorruptRecordNotReadAsNothing(t *testing.T) {
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
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	_, err := s.Get(context.Background(), k) // the horizon starts
	require.NoError(t, err)
	clock.Advance(p.Skew)
	return c, s, clock, k, prefix + "{t:acme}:r|" + k.AttemptID + "|0|/x.Y/Z"
}

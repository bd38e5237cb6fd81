package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A full Redis must refuse new tries and new tombstones (invariant 7: "a
// full store refuses new tries"). Redis refuses only a script's *first*
// write under OOM (scriptVerifyOOM skips the check once SCRIPT_WRITE_DIRTY
// is set, and any CMD_WRITE command sets it, whether or not it changed
// anything). With WithMaxRecordsPerTenant, room() sends ZREMRANGEBYSCORE
// before the record's HSET, so that HSET is never the first write: every
// Begin and Fence of a new record is written past maxmemory.
func TestRegression13bFullRedisRefusesNewTriesWithPerTenantBound(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, "r71oom:", redisstore.WithPolicy(p), clockOption(clock), redisstore.WithMaxRecordsPerTenant(100))
	ctx := context.Background()
	key := func(call string) idempotency.Key {
		return idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: call, Method: "/x.Y/Z"}
	}
	_, err := s.Get(ctx, key("0")) // the tenant's horizon
	require.NoError(t, err)
	clock.Advance(p.Skew)
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
func TestRegression13bFullRedisRefusesNewTriesWithoutBound(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, "r71oom0:", redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k0 := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	_, err := s.Get(ctx, k0)
	require.NoError(t, err)
	clock.Advance(p.Skew)
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	_, beginErr := s.Begin(ctx, idempotency.BeginRequest{Key: k0, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	require.ErrorIs(t, beginErr, idempotency.ErrStoreFull)
}

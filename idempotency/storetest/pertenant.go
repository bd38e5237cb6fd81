package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// RunPerTenantBound checks a store's bound on the records of one tenant
// (the memory store's and redisstore's WithMaxRecordsPerTenant): newStore
// must return a new, empty store that reads time from clock, applies
// policy and holds at most 2 records per tenant. A tenant at its bound is
// refused new tries and fences as a full store refuses them (ErrStoreFull,
// ErrStoreUnavailable), while other tenants still begin theirs; its records
// still answer and finish, a tombstone raised or a fenced try begun again
// takes no room; room comes back as its records expire.
func RunPerTenantBound(t *testing.T, newStore func(t *testing.T, clock *Clock, policy idempotency.Policy) idempotency.Store) {
	t.Helper()
	RunPerTenantBoundKept(t, 0, newStore)
}

// RunPerTenantBoundKept is RunPerTenantBound for a store that keeps a record,
// and counts it against the bound, for kept after its expiry (redisstore's
// DefaultKeep): room comes back that long after the records expire.
func RunPerTenantBoundKept(t *testing.T, kept time.Duration, newStore func(t *testing.T, clock *Clock, policy idempotency.Policy) idempotency.Store) {
	t.Helper()
	clock := NewClock(time.Now().Add(ClockLead))
	p := Policy()
	s := newStore(t, clock, p)
	ctx := context.Background()
	key := func(tenant, attempt string, i int) idempotency.Key {
		return idempotency.Key{Tenant: tenant, AttemptID: attempt, Call: fmt.Sprint(i), Method: method}
	}
	// A store may start a tenant's horizon at its first use, Redis at the
	// later of the call's reading and its own clock: the clock is kept at
	// least ClockLead/2 ahead of real time (moved ClockLead ahead when it
	// is not, see lead) before and after the horizons start, so that they
	// lie behind it (Redis's clock, on this machine, is behind real time),
	// and attempts created skew after it lie inside them.
	lead(clock)
	id := AttemptIDAt(clock.Now())
	for _, tenant := range []string{"a", "b", ""} {
		_, err := s.Get(ctx, key(tenant, id, 0))
		require.NoError(t, err)
	}
	lead(clock)
	clock.Advance(p.Skew)
	id = AttemptIDAt(clock.Now())
	d := clock.Now().Add(time.Second)
	begin := func(k idempotency.Key, try uint32) (idempotency.BeginResult, error) {
		return s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: try, Deadline: d})
	}
	res, err := begin(key("a", id, 0), 1)
	require.NoError(t, err)
	require.True(t, res.Started)
	_, err = s.Fence(ctx, key("a", id, 1), 1) // a tombstone counts as a record
	require.NoError(t, err)
	_, err = begin(key("a", id, 2), 1)
	require.ErrorIs(t, err, idempotency.ErrStoreFull)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorContains(t, err, `tenant "a"`)
	_, err = s.Fence(ctx, key("a", id, 3), 1)
	require.ErrorIs(t, err, idempotency.ErrStoreFull)
	rec, err := s.Get(ctx, key("a", id, 3))
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState(), "the refused fence wrote nothing")
	for _, other := range []string{"b", ""} {
		res, err = begin(key(other, id, 0), 1)
		require.NoError(t, err, "tenant %q", other)
		require.True(t, res.Started)
	}
	// a's records still answer, finish, and are fenced further; its
	// tombstone's next try begins on the record it already has.
	res, err = begin(key("a", id, 0), 2)
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedInProgress, res.Refusal)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: key("a", id, 0), Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED}))
	rec, err = s.Fence(ctx, key("a", id, 1), 2)
	require.NoError(t, err)
	require.Equal(t, uint32(2), rec.GetFencedThroughTry())
	res, err = begin(key("a", id, 1), 3)
	require.NoError(t, err)
	require.True(t, res.Started)
	// When a's records expire (and are no longer kept), a has room again.
	clock.Advance(p.TTL + p.Skew + p.Grace + 2*time.Second + kept)
	id2 := AttemptIDAt(clock.Now())
	d = clock.Now().Add(time.Second)
	for i := range 2 {
		res, err = begin(key("a", id2, i), 1)
		require.NoError(t, err)
		require.True(t, res.Started)
	}
	_, err = begin(key("a", id2, 2), 1)
	require.ErrorIs(t, err, idempotency.ErrStoreFull)
}

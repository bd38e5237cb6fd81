package idempotency_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A record bound per tenant alone does not keep one tenant from filling a
// store that is bounded in bytes too: each record may keep a response of up
// to MaxResponseBytes (a review found tenant "a", holding 4 of its 20
// records, filling a store for everyone). WithMaxBytesPerTenant bounds the
// bytes: a's responses that would take it over its share are not kept (the
// records read SUCCEEDED, response_retained false), its further tries are
// refused when even a record's overhead does not fit, and tenant "b" still
// begins.
func TestMemoryStorePerTenantByteBound(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	p.MaxResponseBytes = 64 << 10 // DefaultPolicy's
	const maxBytes = 256 << 10
	s := newMemory(t, clock, p, idempotency.WithMaxRecords(100), idempotency.WithMaxRecordsPerTenant(20),
		idempotency.WithMaxBytes(maxBytes), idempotency.WithMaxBytesPerTenant(maxBytes/4))
	ctx := context.Background()
	clock.Advance(p.Skew)
	id := storetest.AttemptIDAt(clock.Now())
	d := clock.Now().Add(time.Second)
	key := func(tenant string, i int) idempotency.Key {
		return idempotency.Key{Tenant: tenant, AttemptID: id, Call: fmt.Sprint(i), Method: "/x.Y/Z"}
	}
	resp := make([]byte, 30<<10)
	kept := 0
	for i := range 4 {
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key("a", i), Try: 1, Deadline: d})
		require.NoError(t, err, "a's call %d", i)
		require.True(t, res.Started)
		require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: key("a", i), Try: 1,
			State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: resp}))
		rec, err := s.Get(ctx, key("a", i))
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
		if rec.GetResponseRetained() {
			kept++
		}
	}
	require.Equal(t, 2, kept, "two 30 KiB responses fit a's 64 KiB; the others are not kept")
	for i := range 4 {
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key("b", i), Try: 1, Deadline: d})
		require.NoError(t, err, "tenant b's call %d beside a at its share", i)
		require.True(t, res.Started)
	}
	// a's records fill its share to within less than a record's overhead
	// only once many small ones are added: fill it with tombstones.
	var err error
	for i := 4; err == nil && i < 20; i++ {
		_, err = s.Fence(ctx, key("a", i), 1)
	}
	require.ErrorIs(t, err, idempotency.ErrStoreFull, "a at its byte share is refused")
	require.ErrorContains(t, err, `tenant "a" holds its 65536 bytes`)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key("b", 9), Try: 1, Deadline: d})
	require.NoError(t, err)
	require.True(t, res.Started)
}

func TestMemoryStoreRefusesABadPerTenantByteBound(t *testing.T) {
	for _, n := range []int64{-1, 1, 64<<10 - 1} {
		_, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithMaxBytesPerTenant(n))
		require.ErrorContains(t, err, "WithMaxBytesPerTenant", n)
	}
	_, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithMaxBytesPerTenant(64<<10))
	require.NoError(t, err)
}

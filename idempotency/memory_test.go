package idempotency_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func memoryClock(c *storetest.Clock) idempotency.MemoryOption {
	return hooks.MemoryClock(c.Now).(idempotency.MemoryOption)
}

func newMemory(t testing.TB, clock *storetest.Clock, p idempotency.Policy, opts ...idempotency.MemoryOption) *idempotency.MemoryStore {
	t.Helper()
	s, err := idempotency.NewMemoryStore(idempotency.SingleReplica, append([]idempotency.MemoryOption{idempotency.WithPolicy(p), memoryClock(clock)}, opts...)...)
	require.NoError(t, err)
	return s
}

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock, p idempotency.Policy) storetest.Harness {
		s := newMemory(t, clock, p)
		return storetest.Harness{Store: s, Lose: func(*testing.T) { s.Reset() }}
	})
}

func TestNewMemoryStoreRefusesBadConfig(t *testing.T) {
	_, err := idempotency.NewMemoryStore(idempotency.Replicas{})
	require.ErrorContains(t, err, "SingleReplica")
	p := idempotency.DefaultPolicy()
	p.TTL = p.MaxAttemptDeadline
	_, err = idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.ErrorContains(t, err, "TTL")
	_, err = idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithMaxRecords(0))
	require.Error(t, err)
	_, err = idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithMaxBytes(10))
	require.Error(t, err)
	s, err := idempotency.NewMemoryStore(idempotency.SingleReplica)
	require.NoError(t, err)
	require.Zero(t, s.Len())
}

// A full store refuses new tries and fences instead of evicting, and makes
// room only when records expire.
func TestMemoryStoreFullRefusesInsteadOfEvicting(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	s := newMemory(t, clock, p, idempotency.WithMaxRecords(3))
	ctx := context.Background()
	clock.Advance(p.Skew)
	id := storetest.AttemptIDAt(clock.Now())
	d := clock.Now().Add(time.Second)
	key := func(i int) idempotency.Key {
		return idempotency.Key{AttemptID: id, Call: fmt.Sprint(i), Method: "/x.Y/Z"}
	}
	for i := range 3 {
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key(i), Try: 1, Deadline: d})
		require.NoError(t, err)
		require.True(t, res.Started)
	}
	_, err := s.Begin(ctx, idempotency.BeginRequest{Key: key(3), Try: 1, Deadline: d})
	require.ErrorIs(t, err, idempotency.ErrStoreFull)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	_, err = s.Fence(ctx, key(3), 1)
	require.ErrorIs(t, err, idempotency.ErrStoreFull)
	// Existing records still answer and finish.
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key(0), Try: 2, Deadline: d})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedInProgress, res.Refusal)
	clock.Advance(time.Millisecond)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: key(0), Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED}))
	require.Equal(t, 3, s.Len())
	// Just before expiry nothing is removed; at expiry room appears.
	clock.Advance(p.TTL - 2*time.Millisecond)
	fresh := idempotency.Key{AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	_, err = s.Fence(ctx, fresh, 1)
	require.ErrorIs(t, err, idempotency.ErrStoreFull)
	clock.Advance(time.Millisecond)
	id2 := storetest.AttemptIDAt(clock.Now())
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: idempotency.Key{AttemptID: id2, Call: "0", Method: "/x.Y/Z"}, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.Equal(t, 2, s.Len(), "the record finished last was written later and is kept")
}

// A tenant at WithMaxRecordsPerTenant is refused new tries and fences as a
// full store refuses them, while other tenants still begin theirs
// (storetest.RunPerTenantBound); Reset forgets the accounts with the
// records.
func TestMemoryStorePerTenantBound(t *testing.T) {
	storetest.RunPerTenantBound(t, func(t *testing.T, clock *storetest.Clock, p idempotency.Policy) idempotency.Store {
		return newMemory(t, clock, p, idempotency.WithMaxRecords(100), idempotency.WithMaxRecordsPerTenant(2))
	})
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	s := newMemory(t, clock, p, idempotency.WithMaxRecords(100), idempotency.WithMaxRecordsPerTenant(2))
	ctx := context.Background()
	clock.Advance(p.Skew)
	begin := func(id string, i int) error {
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: idempotency.Key{Tenant: "a", AttemptID: id, Call: fmt.Sprint(i), Method: "/x.Y/Z"}, Try: 1, Deadline: clock.Now().Add(time.Second)})
		if err == nil {
			require.True(t, res.Started)
		}
		return err
	}
	id := storetest.AttemptIDAt(clock.Now())
	require.NoError(t, begin(id, 0))
	require.NoError(t, begin(id, 1))
	require.ErrorIs(t, begin(id, 2), idempotency.ErrStoreFull)
	s.Reset()
	clock.Advance(p.Skew)
	id = storetest.AttemptIDAt(clock.Now())
	require.NoError(t, begin(id, 0))
	require.NoError(t, begin(id, 1))
}

func TestMemoryStoreRefusesANegativePerTenantBound(t *testing.T) {
	_, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithMaxRecordsPerTenant(-1))
	require.ErrorContains(t, err, "WithMaxRecordsPerTenant")
}

// The byte bound counts responses: one that does not fit is not kept, and the
// record is still SUCCEEDED.
func TestMemoryStoreByteBound(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	p.MaxResponseBytes = 64 << 10
	s := newMemory(t, clock, p, idempotency.WithMaxBytes(64<<10))
	ctx := context.Background()
	clock.Advance(p.Skew)
	k := idempotency.Key{AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: make([]byte, 64<<10)}))
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.False(t, rec.GetResponseRetained())
}

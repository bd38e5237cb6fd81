package idempotency_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

// A review found that MemoryStore.Begin read the clock before it took the store's mutex, and
// sweeps and judges absence with that reading. A goroutine that read the
// clock just before a record's expiry and then waited (preempted, or
// queued on the mutex) while another call, reading the clock just after,
// swept the record, finds it gone and — its now still earlier than
// ts − skew + TTL — vouches for the absence: the try of a call that
// already SUCCEEDED started again. The clock hook below stands for a delay
// right after the clock is read: before the lock was taken then, under it
// now. The clock is read under the lock, in every method.
func TestMemoryStaleNowResurrectsSweptRecord(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	var armed atomic.Bool
	readNow, proceed := make(chan struct{}), make(chan struct{})
	now := func() time.Time {
		n := clock.Now()
		if armed.CompareAndSwap(true, false) {
			readNow <- struct{}{}
			<-proceed
		}
		return n
	}
	s, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p),
		hooks.MemoryClock(now).(idempotency.MemoryOption))
	require.NoError(t, err)
	ctx := context.Background()
	clock.Advance(p.Skew)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	long := clock.Now().Add(p.TTL + time.Minute) // an attempt that outlives the TTL (its tries capped per arrival)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(p.MaxAttemptDeadline)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))

	// The record lives TTL after its finish (ts + TTL); absence is evidence
	// until ts - skew + TTL.
	clock.Advance(p.TTL - p.Skew - time.Millisecond)
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())

	armed.Store(true)
	done := make(chan idempotency.BeginResult, 1)
	go func() {
		r, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: long})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	<-readNow // try 2's Begin read the clock: 1 ms before it stops vouching for an absence
	clock.Advance(p.Skew + time.Millisecond)
	// Another call, skew + 1 ms later, sweeps the expired record — at once
	// when Begin holds no lock while it waits; after Begin when it does.
	got := make(chan *tollgatev1.AttemptRecord, 1)
	go func() {
		rec, err := s.Get(ctx, k)
		if err != nil {
			t.Error(err)
		}
		got <- rec
	}()
	var swept *tollgatev1.AttemptRecord
	select {
	case swept = <-got:
	case <-time.After(200 * time.Millisecond): // waiting for the lock Begin holds
	}
	close(proceed)
	r := <-done
	if swept == nil {
		swept = <-got
	}
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, swept.GetState(), "expired: absence is no evidence")
	require.False(t, r.Started, "try 2 of a call whose try 1 SUCCEEDED started: a now read before the lock vouched for a record swept meanwhile (refusal %v)", r.Refusal)
}

// A review found that commit 456d181 reads the memory store's clock under its lock so
// that "readings follow the order calls act in". They do only while the
// clock never goes back: the store reads time.Now().UnixMilli(), the wall
// clock, which an NTP step (or a VM resumed on another host) moves back. A
// call that swept a record at now1 and a later call reading now1 - 1 ms,
// well within the policy's skew, vouches for the absence of the record the
// first swept: the try of a call that SUCCEEDED starts again. The attempt
// here was minted by a client whose clock is the skew ahead (ts = now +
// skew), and its try finished at once, so absence is evidence until the
// very millisecond the record expires. (The Redis store keeps its records
// DefaultKeep past their expiry, which covers such a step.)
func TestRecordsMemoryClockStepBackResurrectsSweptRecord(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	s, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p),
		hooks.MemoryClock(clock.Now).(idempotency.MemoryOption))
	require.NoError(t, err)
	ctx := context.Background()
	clock.Advance(p.Skew)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))

	clock.Advance(p.TTL) // the record's expiry: a Get sweeps it
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())

	clock.Advance(-time.Millisecond) // the wall clock steps back 1 ms (less than the skew)
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 2 of a call whose try 1 SUCCEEDED started: a reading 1 ms earlier than the sweep's vouched for the swept record's absence")
}

// The memory store's nowLocked (commit a1c4f6b) keeps a high-water mark of
// its clock readings, so that a wall clock stepping back cannot vouch for a
// swept record's absence. But a single reading from a clock stepped forward
// (a bad NTP step, a VM resumed with a wrong RTC) that is corrected a moment
// later now stays the store's "now" until real time catches up: every try's
// deadline reads as passed, and every new try is refused DEADLINE_EXPIRED
// for the whole size of the step. Before the commit only the calls made
// during the step were affected.
func TestStoreMemoryClockStepForwardPoisonsStore(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	s := newMemory(t, clock, p)
	ctx := context.Background()
	clock.Advance(p.Skew)

	begin := func(call string) idempotency.BeginResult {
		t.Helper()
		k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: call, Method: "/x.Y/Z"}
		res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(5 * time.Second)})
		require.NoError(t, err)
		return res
	}
	require.True(t, begin("before").Started)

	// The wall clock steps an hour forward; one call reads it; NTP steps it back.
	clock.Advance(time.Hour)
	_, err := s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "probe", Method: "/x.Y/Z"})
	require.NoError(t, err)
	clock.Advance(-time.Hour + time.Second)

	res := begin("after")
	assert.True(t, res.Started,
		"a new try with 5 s left, one second after the clock was corrected, was refused %v: the store still judges by the stepped-forward reading", res.Refusal)

	// Reset, documented to move the horizon "to now, as a restart would",
	// does not recover either.
	s.Reset()
	clock.Advance(p.Skew)
	res = begin("after-reset")
	require.True(t, res.Started, "after Reset, a new try was refused %v", res.Refusal)
}

// The same with a step smaller than the TTL: a forward step of 8 s read by
// one Get and corrected at once leaves the store judging leases by the
// stepped reading, so the handler of a try begun just before, with 5 s
// left, cannot record its success: its Finish is refused and the record
// reads ABANDONED (the owner ends the call UNKNOWN).
func TestStoreMemoryClockStepForwardAbandonsRunningTry(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	s := newMemory(t, clock, p)
	ctx := context.Background()
	clock.Advance(p.Skew)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(5 * time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)

	clock.Advance(8 * time.Second) // a bad step forward, read by one call
	_, err = s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "probe", Method: "/x.Y/Z"})
	require.NoError(t, err)
	clock.Advance(-8*time.Second + 100*time.Millisecond) // corrected; 4.9 s of the try's deadline left

	err = s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")})
	require.NoError(t, err, "the try's handler finished 4.9 s before its deadline, but its success cannot be recorded")
}

// A review found that, while the memory store assumes its clock goes forward "give or take the skew
// plus the grace" (nowLocked). Within that assumption, the clock steps back
// 1 s (skew 500 ms + grace 1 s = 1.5 s) after a try of attempt X SUCCEEDED.
// Reset then drops every record, X's included, but moves the horizon to the
// current (stepped-back) reading rather than to the latest reading the store
// acted on (169ee67): X, whose record was written at that later reading, now
// lies inside the horizon, reads UNSEEN, is fenced, and its try 2 starts —
// the call that SUCCEEDED runs again. Before 169ee67 Reset used the latest
// reading and X read UNKNOWN.
func TestRecordsMemoryResetAfterSmallStepBackVouchesDroppedRecord(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy() // skew 500 ms, grace 1 s
	s := newMemory(t, clock, p)
	ctx := context.Background()
	clock.Advance(2 * time.Second)

	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))

	clock.Advance(-time.Second) // a step back well within skew + grace
	s.Reset()                   // the records are lost, as in a restart
	clock.Advance(600 * time.Millisecond)

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(),
		"the attempt whose SUCCEEDED record Reset dropped must not read UNSEEN")
	_, err = s.Fence(ctx, k, 1)
	require.NoError(t, err)
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started, "try 2 of a call whose try 1 SUCCEEDED started after Reset")
}

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

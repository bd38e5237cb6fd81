// Package storetest is the conformance suite of idempotency.Store: the
// behaviour every store must show (DESIGN.md §3.7, §3.8, §3.11), checked
// against a real store with a manual [Clock]. The memory store and
// idempotency/redisstore pass it; so must any other store.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, clock *storetest.Clock, p idempotency.Policy) storetest.Harness {
//			s := newMyStore(t, p, clock.Now)
//			return storetest.Harness{Store: s, Lose: s.dropEverything}
//		})
//	}
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Harness is a store under test.
type Harness struct {
	// Store is the store, built to read time from the clock given to the
	// constructor and to apply the policy given to it.
	Store idempotency.Store
	// Lose makes the store lose every record it holds, as a flush, restart,
	// restore or failover would; the store must move its horizon. Nil skips
	// the test of loss. Run also calls it, before a subtest starts, when it
	// moved the suite's clock ahead (building the store took half of
	// ClockLead or more) or real time caught up with the clock while the
	// horizons started (see ClockLead), to start them again at the clock.
	Lose func(t *testing.T)
}

// Policy is the policy the suite builds stores with: a skew of 500 ms, so
// that skewed attempt times are tested, and short times otherwise.
func Policy() idempotency.Policy {
	return idempotency.Policy{
		Skew:               500 * time.Millisecond,
		Grace:              time.Second,
		MaxAttemptDeadline: 10 * time.Second,
		TTL:                20 * time.Second,
		MaxResponseBytes:   1024,
	}
}

// Run runs the conformance suite. newStore must return a new, empty store
// for each subtest, reading time from clock and applying policy, and
// release it with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T, clock *Clock, policy idempotency.Policy) Harness) {
	t.Helper()
	setup := func(t *testing.T) *env {
		clock := NewClock(time.Now().Add(ClockLead))
		p := Policy()
		h := newStore(t, clock, p)
		e := &env{t: t, clock: clock, p: p, h: h, s: h.Store, ctx: context.Background()}
		// A store may start a tenant's horizon at its first use (Redis
		// does): use every tenant of the suite now, then let skew pass, so
		// that attempts minted from here on lie inside every horizon.
		// Redis starts a horizon at the later of the call's reading and
		// its own clock: when building the store took half the lead or
		// more, the suite's clock is moved ClockLead ahead of real time
		// again, and the store loses its records so that a horizon it
		// started when it was built (memory's) starts again at the moved
		// clock, where the tests take it to lie (e.start); and when a
		// loaded machine took the rest of the lead before the horizons
		// started, they may lie past e.start: the store loses them and
		// they start again.
		for attempt := 1; ; attempt++ {
			if lead(clock) && h.Lose != nil {
				h.Lose(t)
			}
			e.start = clock.Now()
			for _, tenant := range []string{"tenant-a", "tenant-b", ""} {
				e.get(idempotency.Key{Tenant: tenant, AttemptID: AttemptIDAt(e.start), Call: "0", Method: method})
			}
			if time.Now().Before(e.start) || h.Lose == nil || attempt == 3 {
				break
			}
		}
		clock.Advance(p.Skew)
		return e
	}
	tests := []struct {
		name string
		fn   func(*env)
	}{
		{"SucceededReplaysToEveryTry", testSucceeded},
		{"FailedKeepsStatus", testFailed},
		{"UnknownAnswersEveryTry", testUnknown},
		{"FencedFinishAdmitsNextTry", testFencedFinish},
		{"GetAbsentIsUnseen", testGetUnseen},
		{"InProgressThenAbandoned", testAbandoned},
		{"ConcurrentBeginsOneWins", testConcurrentBegins},
		{"ConcurrentTriesRunHandlerOnce", testConcurrentTries},
		{"FenceBallots", testFenceBallots},
		{"FenceReturnsOtherRecordsAsTheyAre", testFenceOthers},
		{"TombstonesKeepUnits", testTombstoneUnits},
		{"Mismatch", testMismatch},
		{"ZeroFingerprintMatchesEveryRequest", testZeroFingerprint},
		{"DeadlineExpired", testDeadlineExpired},
		{"RecordExpiry", testRecordExpiry},
		{"HorizonNonUUIDv7", testHorizonNonV7},
		{"HorizonSkewedAndFutureTimes", testHorizonSkew},
		{"LossMovesHorizon", testLoss},
		{"MintedSkipsOnlyHorizonPlusSkew", testMinted},
		{"MintedAfterLoss", testMintedAfterLoss},
		{"TenantIsolation", testTenants},
		{"ResponseSizeLimit", testResponseLimit},
		{"CallsOfOneAttemptAreApart", testCallsApart},
		{"MalformedInput", testMalformed},
		{"CanceledContext", testCanceled},
		{"SteppedBackFinishOutlivesEvidence", testSteppedBackFinish},
		{"FenceOutlivesFencedTry", testFenceOutlivesFencedTry},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(setup(t)) })
	}
}

type env struct {
	t     *testing.T
	clock *Clock
	p     idempotency.Policy
	h     Harness
	s     idempotency.Store
	ctx   context.Context
	start time.Time // the horizon
}

const method = "/tollgate.test.Orders/Place"

var (
	reqA = []byte("place order 1")
	fpA  = idempotency.Fingerprint(method, reqA)
	fpB  = idempotency.Fingerprint(method, []byte("place order 2"))
)

// key returns a key of a new attempt minted now.
func (e *env) key() idempotency.Key {
	return idempotency.Key{Tenant: "tenant-a", AttemptID: AttemptIDAt(e.clock.Now()), Call: "0", Method: method}
}

func (e *env) deadline() time.Time { return e.clock.Now().Add(5 * time.Second) }

func (e *env) begin(k idempotency.Key, try uint32, fp idempotency.Digest, d time.Time) idempotency.BeginResult {
	e.t.Helper()
	res, err := e.s.Begin(e.ctx, idempotency.BeginRequest{Key: k, Try: try, Fingerprint: fp, Deadline: d})
	require.NoError(e.t, err)
	return res
}

func (e *env) mustStart(k idempotency.Key, try uint32, d time.Time) {
	e.t.Helper()
	res := e.begin(k, try, fpA, d)
	require.True(e.t, res.Started, "try %d of %v did not start: %v %v", try, k, res.Refusal, res.Record)
	require.Equal(e.t, idempotency.NotRefused, res.Refusal)
	require.Nil(e.t, res.Record)
}

func (e *env) refused(k idempotency.Key, try uint32, fp idempotency.Digest, want idempotency.Refusal) *tollgatev1.AttemptRecord {
	e.t.Helper()
	res := e.begin(k, try, fp, e.deadline())
	require.False(e.t, res.Started, "try %d started; want %v", try, want)
	require.Equal(e.t, want, res.Refusal)
	return res.Record
}

func (e *env) finish(req idempotency.FinishRequest) {
	e.t.Helper()
	if req.Fingerprint == (idempotency.Digest{}) {
		req.Fingerprint = fpA
	}
	require.NoError(e.t, e.s.Finish(e.ctx, req))
}

func (e *env) get(k idempotency.Key) *tollgatev1.AttemptRecord {
	e.t.Helper()
	rec, err := e.s.Get(e.ctx, k)
	require.NoError(e.t, err)
	return rec
}

func (e *env) fence(k idempotency.Key, n uint32) *tollgatev1.AttemptRecord {
	e.t.Helper()
	rec, err := e.s.Fence(e.ctx, k, n)
	require.NoError(e.t, err)
	return rec
}

func ts(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t.Truncate(time.Millisecond)) }

// equalRecord fails t unless want and got are equal protobuf messages.
// (protocmp would need github.com/google/go-cmp in the module's go.mod, which
// this package does not own; proto.Equal with a text dump says as much.)
func equalRecord(t *testing.T, want, got *tollgatev1.AttemptRecord) {
	t.Helper()
	if !proto.Equal(want, got) {
		t.Fatalf("record mismatch:\nwant: %s\ngot:  %s", prototext.Format(want), prototext.Format(got))
	}
}

func base(k idempotency.Key, st tollgatev1.AttemptState) *tollgatev1.AttemptRecord {
	return &tollgatev1.AttemptRecord{AttemptId: k.AttemptID, Call: k.Call, Method: k.Method, State: st}
}

func testSucceeded(e *env) {
	k := e.key()
	d := e.deadline()
	started := e.clock.Now()
	e.mustStart(k, 1, d)
	e.clock.Advance(100 * time.Millisecond)
	finished := e.clock.Now()
	e.finish(idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("order 1 placed"), UnitsSpent: 2})
	want := base(k, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED)
	want.Try = 1
	want.Response = []byte("order 1 placed")
	want.ResponseRetained = true
	want.UnitsSpent = 2
	want.StartedAt = ts(started)
	want.FinishedAt = ts(finished)
	want.LeaseExpiresAt = ts(d.Add(e.p.Skew))
	equalRecord(e.t, want, e.get(k))
	for _, try := range []uint32{1, 2, 7} {
		equalRecord(e.t, want, e.refused(k, try, fpA, idempotency.RefusedFinished))
	}
	// A fence does not change a finished record.
	equalRecord(e.t, want, e.fence(k, 9))
	// Finishing again is refused and changes nothing.
	err := e.s.Finish(e.ctx, idempotency.FinishRequest{Key: k, Try: 1, Fingerprint: fpA, State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, Code: codes.NotFound})
	require.ErrorIs(e.t, err, idempotency.ErrNotRunning)
	equalRecord(e.t, want, e.get(k))
}

func testFailed(e *env) {
	k := e.key()
	e.mustStart(k, 1, e.deadline())
	detail, err := anypb.New(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "sku", Description: "unknown"}}})
	require.NoError(e.t, err)
	e.finish(idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED,
		Code: codes.InvalidArgument, Message: "unknown sku", Details: []*anypb.Any{detail}, UnitsSpent: 1})
	rec := e.get(k)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, rec.GetState())
	require.Equal(e.t, int32(codes.InvalidArgument), rec.GetStatusCode())
	require.Equal(e.t, "unknown sku", rec.GetStatusMessage())
	require.Len(e.t, rec.GetStatusDetails(), 1)
	require.True(e.t, proto.Equal(detail, rec.GetStatusDetails()[0]), "%v", rec.GetStatusDetails())
	require.False(e.t, rec.GetResponseRetained())
	require.Equal(e.t, int64(1), rec.GetUnitsSpent())
	equalRecord(e.t, rec, e.refused(k, 2, fpA, idempotency.RefusedFinished))
}

func testUnknown(e *env) {
	k := e.key()
	e.mustStart(k, 1, e.deadline())
	e.finish(idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, Code: codes.Internal, Message: "panic recovered"})
	rec := e.get(k)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())
	require.Equal(e.t, int32(codes.Internal), rec.GetStatusCode())
	for _, try := range []uint32{1, 2, 1000} {
		equalRecord(e.t, rec, e.refused(k, try, fpA, idempotency.RefusedFinished))
	}
	equalRecord(e.t, rec, e.fence(k, 5))
}

func testFencedFinish(e *env) {
	k := e.key()
	e.mustStart(k, 1, e.deadline())
	e.finish(idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, UnitsSpent: 3})
	rec := e.get(k)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	require.Equal(e.t, uint32(1), rec.GetFencedThroughTry())
	require.Equal(e.t, int64(3), rec.GetUnitsSpent())
	equalRecord(e.t, rec, e.refused(k, 1, fpA, idempotency.RefusedFenced))
	e.mustStart(k, 2, e.deadline())
	rec = e.get(k)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState())
	require.Equal(e.t, uint32(2), rec.GetTry())
	require.Equal(e.t, uint32(1), rec.GetFencedThroughTry())
	require.Equal(e.t, int64(3), rec.GetUnitsSpent())
	require.Nil(e.t, rec.GetFinishedAt())
}

func testGetUnseen(e *env) {
	k := e.key()
	equalRecord(e.t, base(k, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN), e.get(k))
	// A lookup is read only: a try still starts afterwards.
	e.mustStart(k, 1, e.deadline())
}

func testAbandoned(e *env) {
	k := e.key()
	d := e.deadline()
	e.mustStart(k, 1, d)
	lease := d.Add(e.p.Skew)
	for _, at := range []time.Time{e.clock.Now(), lease.Add(-time.Millisecond)} {
		e.clock.Advance(at.Sub(e.clock.Now()))
		rec := e.get(k)
		require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState())
		require.True(e.t, proto.Equal(ts(lease), rec.GetLeaseExpiresAt()), "lease %v", rec.GetLeaseExpiresAt())
		e.refused(k, 1, fpA, idempotency.RefusedInProgress)
		e.refused(k, 2, fpA, idempotency.RefusedInProgress)
		require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, e.fence(k, 1).GetState())
	}
	e.clock.Advance(time.Millisecond) // the lease ends
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, e.get(k).GetState())
	err := e.s.Finish(e.ctx, idempotency.FinishRequest{Key: k, Try: 1, Fingerprint: fpA, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED})
	require.ErrorIs(e.t, err, idempotency.ErrNotRunning)
	for _, try := range []uint32{1, 2, 3} {
		require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, e.refused(k, try, fpA, idempotency.RefusedAbandoned).GetState())
	}
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, e.fence(k, 3).GetState())
	e.clock.Advance(e.p.Grace)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, e.get(k).GetState())
}

func testConcurrentBegins(e *env) {
	k := e.key()
	d := e.deadline()
	const n = 64
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]idempotency.BeginResult, n)
		errs    = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = e.s.Begin(e.ctx, idempotency.BeginRequest{Key: k, Try: 1, Fingerprint: fpA, Deadline: d})
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for i := range n {
		require.NoError(e.t, errs[i])
		if results[i].Started {
			won++
			continue
		}
		require.Equal(e.t, idempotency.RefusedInProgress, results[i].Refusal)
		require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, results[i].Record.GetState())
	}
	require.Equal(e.t, 1, won)
}

// 50 tries of one call, numbered 1–50 and sent at once, against a handler
// that increments a counter: the counter ends at 1, and every other try is
// answered IN_PROGRESS or with the finished record.
func testConcurrentTries(e *env) {
	k := e.key()
	d := e.deadline()
	const n = 50
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		mu      sync.Mutex
		counter int
		errs    = make([]error, n)
		refused = make([]idempotency.Refusal, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := e.s.Begin(e.ctx, idempotency.BeginRequest{Key: k, Try: uint32(i + 1), Fingerprint: fpA, Deadline: d})
			if err != nil || !res.Started {
				errs[i], refused[i] = err, res.Refusal
				return
			}
			mu.Lock()
			counter++
			mu.Unlock()
			errs[i] = e.s.Finish(e.ctx, idempotency.FinishRequest{Key: k, Try: uint32(i + 1), Fingerprint: fpA,
				State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("once")})
		})
	}
	close(start)
	wg.Wait()
	require.Equal(e.t, 1, counter)
	for i := range n {
		require.NoError(e.t, errs[i])
		require.Contains(e.t, []idempotency.Refusal{idempotency.NotRefused, idempotency.RefusedInProgress, idempotency.RefusedFinished}, refused[i])
	}
	rec := e.get(k)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.Equal(e.t, []byte("once"), rec.GetResponse())
}

func testFenceBallots(e *env) {
	k := e.key()
	want := base(k, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED)
	want.FencedThroughTry = 2
	want.FinishedAt = ts(e.clock.Now())
	equalRecord(e.t, want, e.fence(k, 2))
	// Late tries ≤ 2 can never start; a lower fence changes nothing.
	e.refused(k, 1, fpA, idempotency.RefusedFenced)
	e.refused(k, 2, fpA, idempotency.RefusedFenced)
	equalRecord(e.t, want, e.fence(k, 1))
	equalRecord(e.t, want, e.fence(k, 2))
	// A higher fence moves it up.
	e.clock.Advance(time.Millisecond)
	rec := e.fence(k, 4)
	require.Equal(e.t, uint32(4), rec.GetFencedThroughTry())
	e.refused(k, 3, fpA, idempotency.RefusedFenced)
	e.refused(k, 4, fpA, idempotency.RefusedFenced)
	// Try 5 starts (a tombstone made by a fence has no fingerprint).
	e.mustStart(k, 5, e.deadline())
	// The try ends without effect: the tombstone moves to 5, never back.
	e.finish(idempotency.FinishRequest{Key: k, Try: 5, State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED})
	rec = e.get(k)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	require.Equal(e.t, uint32(5), rec.GetFencedThroughTry())
	require.Equal(e.t, uint32(5), e.fence(k, 3).GetFencedThroughTry())
	e.refused(k, 4, fpA, idempotency.RefusedFenced)
	e.refused(k, 5, fpA, idempotency.RefusedFenced)
	// Now it carries try 5's fingerprint.
	e.refused(k, 6, fpB, idempotency.RefusedMismatch)
	e.mustStart(k, 6, e.deadline())
	e.finish(idempotency.FinishRequest{Key: k, Try: 6, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")})
	rec = e.get(k)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.Equal(e.t, uint32(5), rec.GetFencedThroughTry())
	// A finished record answers every try, even one the fence would admit.
	e.refused(k, 1, fpA, idempotency.RefusedFinished)
	e.refused(k, 9, fpA, idempotency.RefusedFinished)
}

func testFenceOthers(e *env) {
	k := e.key()
	e.mustStart(k, 1, e.deadline())
	before := e.get(k)
	equalRecord(e.t, before, e.fence(k, 1))
	equalRecord(e.t, before, e.fence(k, 3))
	equalRecord(e.t, before, e.get(k))
	// The running try still finishes.
	e.finish(idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED})
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, e.get(k).GetState())
}

func testTombstoneUnits(e *env) {
	k := e.key()
	steps := []struct {
		try   uint32
		units int64
		state tollgatev1.AttemptState
	}{
		{1, 3, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED},
		{2, 2, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED},
		{3, 1, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED},
	}
	var total int64
	for _, st := range steps {
		e.mustStart(k, st.try, e.deadline())
		require.Equal(e.t, total, e.get(k).GetUnitsSpent())
		e.finish(idempotency.FinishRequest{Key: k, Try: st.try, State: st.state, UnitsSpent: st.units})
		total += st.units
		require.Equal(e.t, total, e.get(k).GetUnitsSpent())
	}
	// A fence of a later ballot keeps the units of an absent call's tombstone too.
	k2 := e.key()
	k2.Call = "1"
	e.fence(k2, 1)
	e.mustStart(k2, 2, e.deadline())
	e.finish(idempotency.FinishRequest{Key: k2, Try: 2, State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, UnitsSpent: 4})
	require.Equal(e.t, int64(4), e.fence(k2, 3).GetUnitsSpent())
	require.Equal(e.t, uint32(3), e.get(k2).GetFencedThroughTry())
}

func testMismatch(e *env) {
	k := e.key()
	e.mustStart(k, 1, e.deadline())
	rec := e.refused(k, 1, fpB, idempotency.RefusedMismatch)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState())
	err := e.s.Finish(e.ctx, idempotency.FinishRequest{Key: k, Try: 1, Fingerprint: fpB, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED})
	require.ErrorIs(e.t, err, idempotency.ErrNotRunning)
	e.finish(idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("r")})
	rec = e.refused(k, 2, fpB, idempotency.RefusedMismatch)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	// Another method is another record.
	k2 := k
	k2.Method = "/tollgate.test.Orders/Cancel"
	e.mustStart(k2, 1, e.deadline())
}

// testZeroFingerprint: a try begun with the zero Digest ("no
// fingerprint") makes a record that no later request mismatches, in every
// store alike.
func testZeroFingerprint(e *env) {
	k := e.key()
	res := e.begin(k, 1, idempotency.Digest{}, e.deadline())
	require.True(e.t, res.Started, "%v %v", res.Refusal, res.Record)
	require.NoError(e.t, e.s.Finish(e.ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("r")}))
	rec := e.refused(k, 2, fpB, idempotency.RefusedFinished)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.Equal(e.t, []byte("r"), rec.GetResponse())
}

func testDeadlineExpired(e *env) {
	k := e.key()
	d := e.clock.Now().Add(-e.p.Skew + time.Millisecond) // d + skew is a millisecond away: still in time
	e.mustStart(k, 1, d)
	k2 := e.key()
	k2.Call = "1"
	// At d + skew exactly the try's lease (d + skew) has ended: a try begun
	// then would read ABANDONED at once and could never be finished, so it
	// is refused, as the interceptor refuses it.
	res := e.begin(k2, 1, fpA, d.Add(-time.Millisecond))
	require.False(e.t, res.Started)
	require.Equal(e.t, idempotency.RefusedDeadlineExpired, res.Refusal)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, e.get(k2).GetState())
	// A tombstone's next try is refused after the deadline too.
	e.fence(k2, 1)
	res = e.begin(k2, 2, fpA, d.Add(-time.Millisecond))
	require.Equal(e.t, idempotency.RefusedDeadlineExpired, res.Refusal)
	// At d + skew exactly: refused, never begun as a try whose lease has
	// already ended.
	k3 := e.key()
	k3.Call = "2"
	res = e.begin(k3, 1, fpA, e.clock.Now().Add(-e.p.Skew))
	require.Equal(e.t, idempotency.RefusedDeadlineExpired, res.Refusal, "at d + skew exactly")
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, e.get(k3).GetState())
}

func testRecordExpiry(e *env) {
	k := e.key()
	d := e.deadline()
	e.mustStart(k, 1, d)
	e.finish(idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED})
	e.clock.Advance(e.p.TTL - time.Millisecond)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, e.get(k).GetState())
	e.clock.Advance(time.Millisecond)
	// Gone, and its absence is not evidence: UNKNOWN, never UNSEEN.
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.get(k).GetState())
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.fence(k, 1).GetState())
	res := e.begin(k, 2, fpA, e.deadline())
	require.Equal(e.t, idempotency.RefusedUnverifiable, res.Refusal)

	// A record whose deadline lies beyond the TTL lives until d + skew + grace.
	k2 := e.key()
	d2 := e.clock.Now().Add(e.p.TTL + 5*time.Second)
	e.mustStart(k2, 1, d2)
	e.finish(idempotency.FinishRequest{Key: k2, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED})
	e.clock.Advance(d2.Add(e.p.Skew + e.p.Grace - time.Millisecond).Sub(e.clock.Now()))
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, e.get(k2).GetState())
	e.clock.Advance(time.Millisecond)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.get(k2).GetState())
}

func testHorizonNonV7(e *env) {
	for _, id := range []string{uuid.NewString(), "order-42", strings.ToUpper(uuid.Must(uuid.NewV7()).String()[:35]) + "x"} {
		k := idempotency.Key{Tenant: "tenant-a", AttemptID: id, Call: "0", Method: method}
		rec := e.refused(k, 1, fpA, idempotency.RefusedUnverifiable)
		equalRecord(e.t, base(k, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN), rec)
		equalRecord(e.t, base(k, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN), e.get(k))
		equalRecord(e.t, base(k, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN), e.fence(k, 1))
		e.refused(k, 2, fpA, idempotency.RefusedUnverifiable)
	}
}

func testHorizonSkew(e *env) {
	// The store's horizon is the clock's start (memory: construction;
	// Redis: first use, in setup).
	horizon := e.start
	e.clock.Advance(e.p.Skew)
	at := func(t time.Time) idempotency.Key {
		return idempotency.Key{Tenant: "tenant-a", AttemptID: AttemptIDAt(t), Call: "0", Method: method}
	}
	now := e.clock.Now()
	cases := []struct {
		name string
		t    time.Time
		want tollgatev1.AttemptState
	}{
		{"before the horizon", horizon.Add(-time.Second), tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN},
		{"less than skew after the horizon", horizon.Add(e.p.Skew - time.Millisecond), tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN},
		{"skew after the horizon", horizon.Add(e.p.Skew), tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN},
		{"now", now, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN},
		{"skew in the future", now.Add(e.p.Skew), tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN},
		{"beyond skew in the future", now.Add(e.p.Skew + time.Millisecond), tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN},
		{"an hour in the future", now.Add(time.Hour), tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN},
	}
	for _, c := range cases {
		k := at(c.t)
		require.Equal(e.t, c.want, e.get(k).GetState(), "get: %s", c.name)
		res := e.begin(k, 1, fpA, e.deadline())
		if c.want == tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN {
			require.Equal(e.t, idempotency.RefusedUnverifiable, res.Refusal, "begin: %s", c.name)
			require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.fence(k, 1).GetState(), "fence: %s", c.name)
		} else {
			require.True(e.t, res.Started, "begin: %s: %v", c.name, res.Refusal)
		}
	}
	// Absence stops being evidence once a record could have expired.
	k := at(now)
	e.clock.Advance(e.p.TTL - e.p.Skew - time.Millisecond)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, e.get(k).GetState())
	e.clock.Advance(time.Millisecond)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.get(k).GetState())
}

func testLoss(e *env) {
	if e.h.Lose == nil {
		e.t.Skip("the store offers no way to lose its records")
	}
	k := e.key()
	e.mustStart(k, 1, e.deadline())
	e.clock.Advance(time.Second)
	e.h.Lose(e.t)
	// Whatever the store answered before, it cannot vouch for k now.
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.get(k).GetState())
	e.refused(k, 1, fpA, idempotency.RefusedUnverifiable)
	e.refused(k, 2, fpA, idempotency.RefusedUnverifiable)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.fence(k, 1).GetState())
	// Attempts created skew after the loss are vouched for again.
	e.clock.Advance(e.p.Skew)
	k2 := e.key()
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, e.get(k2).GetState())
	e.mustStart(k2, 1, e.deadline())
}

// beginMinted begins try of k as a try of an attempt the serving server
// minted for the request itself.
func (e *env) beginMinted(k idempotency.Key, try uint32, fp idempotency.Digest, d time.Time) idempotency.BeginResult {
	e.t.Helper()
	res, err := e.s.Begin(e.ctx, idempotency.BeginRequest{Key: k, Try: try, Fingerprint: fp, Deadline: d, Minted: true})
	require.NoError(e.t, err)
	return res
}

// An attempt the serving server minted for the request (BeginRequest.Minted)
// cannot have been sent anywhere before, so a store begins it although it
// was created less than skew after the horizon; the same time in a caller's
// attempt is refused, and says when a new attempt would be verifiable. Every
// other check stays.
func testMinted(e *env) {
	horizon := e.start // the clock reads horizon + skew (setup)
	at := func(t time.Time) idempotency.Key {
		return idempotency.Key{Tenant: "tenant-a", AttemptID: AttemptIDAt(t), Call: "0", Method: method}
	}
	for _, created := range []time.Time{horizon, horizon.Add(e.p.Skew - time.Millisecond)} {
		caller := at(created)
		res := e.begin(caller, 1, fpA, e.deadline())
		require.Equal(e.t, idempotency.RefusedUnverifiable, res.Refusal, "a caller's attempt created %v after the horizon", created.Sub(horizon))
		equalRecord(e.t, base(caller, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN), res.Record)
		require.True(e.t, horizon.Add(e.p.Skew).Equal(res.VerifiableFrom), "VerifiableFrom %v, want horizon + skew %v", res.VerifiableFrom, horizon.Add(e.p.Skew))

		minted := at(created)
		res = e.beginMinted(minted, 1, fpA, e.deadline())
		require.True(e.t, res.Started, "a minted attempt created %v after the horizon: %v", created.Sub(horizon), res.Refusal)
		require.True(e.t, res.VerifiableFrom.IsZero())
		require.NoError(e.t, e.s.Finish(e.ctx, idempotency.FinishRequest{Key: minted, Try: 1, Fingerprint: fpA, Minted: true,
			State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("done")}))
		// The record answers a later Begin of the key; a different request
		// is still a mismatch.
		res = e.beginMinted(minted, 1, fpA, e.deadline())
		require.Equal(e.t, idempotency.RefusedFinished, res.Refusal)
		require.Equal(e.t, []byte("done"), res.Record.GetResponse())
		require.Equal(e.t, idempotency.RefusedMismatch, e.beginMinted(minted, 2, fpB, e.deadline()).Refusal)
		// Minted widens Begin only: lookups still cannot vouch for it.
		require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.get(minted).GetState())
	}
	// A caller's attempt created horizon + skew is inside: nothing to say.
	res := e.begin(at(horizon.Add(e.p.Skew)), 1, fpA, e.deadline())
	require.True(e.t, res.Started, "%v", res.Refusal)

	// Every other check stays. Created beyond skew in the future: refused,
	// and no horizon to wait for.
	res = e.beginMinted(at(e.clock.Now().Add(e.p.Skew+time.Millisecond)), 1, fpA, e.deadline())
	require.Equal(e.t, idempotency.RefusedUnverifiable, res.Refusal)
	require.True(e.t, res.VerifiableFrom.IsZero(), "%v", res.VerifiableFrom)
	res = e.begin(at(e.clock.Now().Add(e.p.Skew+time.Millisecond)), 1, fpA, e.deadline())
	require.True(e.t, res.VerifiableFrom.IsZero(), "%v", res.VerifiableFrom)
	// A non-UUIDv7 ID is never verifiable.
	k := idempotency.Key{Tenant: "tenant-a", AttemptID: uuid.NewString(), Call: "0", Method: method}
	require.Equal(e.t, idempotency.RefusedUnverifiable, e.beginMinted(k, 1, fpA, e.deadline()).Refusal)
	// The deadline plus skew has passed.
	res = e.beginMinted(at(e.clock.Now()), 1, fpA, e.clock.Now().Add(-e.p.Skew))
	require.Equal(e.t, idempotency.RefusedDeadlineExpired, res.Refusal)
	// Created so long ago that a record of it could have expired.
	old := at(e.clock.Now())
	e.clock.Advance(e.p.TTL - e.p.Skew)
	res = e.beginMinted(old, 1, fpA, e.deadline())
	require.Equal(e.t, idempotency.RefusedUnverifiable, res.Refusal)
	require.True(e.t, res.VerifiableFrom.IsZero(), "the horizon is not why: %v", res.VerifiableFrom)
}

// After the store lost its records, its horizon is now: a caller's attempt
// created now is refused until skew has passed, a minted one begins and
// finishes at once.
func testMintedAfterLoss(e *env) {
	if e.h.Lose == nil {
		e.t.Skip("the store offers no way to lose its records")
	}
	e.clock.Advance(time.Second)
	e.h.Lose(e.t)
	lost := e.clock.Now()
	caller := e.key()
	res := e.begin(caller, 1, fpA, e.deadline())
	require.Equal(e.t, idempotency.RefusedUnverifiable, res.Refusal)
	require.True(e.t, lost.Add(e.p.Skew).Equal(res.VerifiableFrom), "VerifiableFrom %v, want %v", res.VerifiableFrom, lost.Add(e.p.Skew))

	minted := e.key()
	e.clock.Advance(time.Millisecond)
	res = e.beginMinted(minted, 1, fpA, e.deadline())
	require.True(e.t, res.Started, "%v", res.Refusal)
	e.clock.Advance(time.Millisecond)
	require.NoError(e.t, e.s.Finish(e.ctx, idempotency.FinishRequest{Key: minted, Try: 1, Fingerprint: fpA, Minted: true,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, Code: codes.NotFound, Message: "no such order"}))
	res = e.beginMinted(minted, 2, fpA, e.deadline())
	require.Equal(e.t, idempotency.RefusedFinished, res.Refusal)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, res.Record.GetState())
	require.Equal(e.t, "no such order", res.Record.GetStatusMessage())

	// Once skew has passed, a caller's new attempt is inside again.
	e.clock.Advance(lost.Add(e.p.Skew).Sub(e.clock.Now()))
	e.mustStart(e.key(), 1, e.deadline())
}

func testTenants(e *env) {
	a := e.key()
	b := a
	b.Tenant = "tenant-b"
	e.mustStart(a, 1, e.deadline())
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, e.get(b).GetState())
	// B's fence makes B's own tombstone, not A's.
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, e.fence(b, 3).GetState())
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, e.get(a).GetState())
	e.finish(idempotency.FinishRequest{Key: a, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("a")})
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, e.get(a).GetState())
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, e.get(b).GetState())
	// The empty tenant is a tenant of its own.
	n := a
	n.Tenant = ""
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, e.get(n).GetState())
	e.mustStart(n, 1, e.deadline())
}

func testResponseLimit(e *env) {
	for _, size := range []int{e.p.MaxResponseBytes, e.p.MaxResponseBytes + 1} {
		k := e.key()
		k.Call = fmt.Sprint(size)
		e.mustStart(k, 1, e.deadline())
		resp := []byte(strings.Repeat("x", size))
		e.finish(idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: resp})
		resp[0] = 'y' // the store copied it
		rec := e.get(k)
		require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
		if size <= e.p.MaxResponseBytes {
			require.True(e.t, rec.GetResponseRetained())
			require.Equal(e.t, strings.Repeat("x", size), string(rec.GetResponse()))
		} else {
			require.False(e.t, rec.GetResponseRetained())
			require.Empty(e.t, rec.GetResponse())
		}
	}
	// A withheld response (a stream's) is not kept, however small: an
	// empty retained response would replay as an empty success.
	k := e.key()
	k.Call = "withheld"
	e.mustStart(k, 1, e.deadline())
	e.finish(idempotency.FinishRequest{Key: k, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Withheld: true})
	rec := e.get(k)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.False(e.t, rec.GetResponseRetained())
}

func testCallsApart(e *env) {
	k0 := e.key()
	k1 := k0
	k1.Call = "1"
	e.mustStart(k0, 1, e.deadline())
	e.mustStart(k1, 1, e.deadline())
	e.finish(idempotency.FinishRequest{Key: k1, Try: 1, State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED})
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, e.get(k0).GetState())
}

func testMalformed(e *env) {
	good := e.key()
	bad := []idempotency.Key{
		{Tenant: good.Tenant, Call: "0", Method: method},
		{Tenant: good.Tenant, AttemptID: good.AttemptID, Method: method},
		{Tenant: good.Tenant, AttemptID: good.AttemptID, Call: "0"},
		{Tenant: good.Tenant, AttemptID: good.AttemptID, Call: "a b", Method: method},
		{Tenant: good.Tenant, AttemptID: good.AttemptID, Call: strings.Repeat("c", 129), Method: method},
		{Tenant: good.Tenant, AttemptID: good.AttemptID, Call: "0", Method: "Place"},
		{Tenant: "{x}", AttemptID: good.AttemptID, Call: "0", Method: method},
	}
	for _, k := range bad {
		_, err := e.s.Begin(e.ctx, idempotency.BeginRequest{Key: k, Try: 1, Fingerprint: fpA, Deadline: e.deadline()})
		require.ErrorIs(e.t, err, idempotency.ErrMalformedKey, "%+v", k)
		_, err = e.s.Get(e.ctx, k)
		require.ErrorIs(e.t, err, idempotency.ErrMalformedKey, "%+v", k)
		_, err = e.s.Fence(e.ctx, k, 1)
		require.ErrorIs(e.t, err, idempotency.ErrMalformedKey, "%+v", k)
	}
	_, err := e.s.Begin(e.ctx, idempotency.BeginRequest{Key: good, Try: 0, Fingerprint: fpA, Deadline: e.deadline()})
	require.ErrorIs(e.t, err, idempotency.ErrMalformedKey)
	_, err = e.s.Begin(e.ctx, idempotency.BeginRequest{Key: good, Try: 1, Fingerprint: fpA})
	require.ErrorIs(e.t, err, idempotency.ErrMalformedKey)
	_, err = e.s.Fence(e.ctx, good, 0)
	require.ErrorIs(e.t, err, idempotency.ErrMalformedKey)
	err = e.s.Finish(e.ctx, idempotency.FinishRequest{Key: good, Try: 1, Fingerprint: fpA, State: tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS})
	require.ErrorIs(e.t, err, idempotency.ErrMalformedKey)
	err = e.s.Finish(e.ctx, idempotency.FinishRequest{Key: good, Try: 1, Fingerprint: fpA, State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED})
	require.ErrorIs(e.t, err, idempotency.ErrMalformedKey, "FAILED needs a code")
	// Nothing was written.
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, e.get(good).GetState())
}

func testCanceled(e *env) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	k := e.key()
	_, err := e.s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Fingerprint: fpA, Deadline: e.deadline()})
	require.ErrorIs(e.t, err, idempotency.ErrStoreUnavailable)
	require.True(e.t, errors.Is(err, context.Canceled), "%v", err)
	_, err = e.s.Get(ctx, k)
	require.ErrorIs(e.t, err, idempotency.ErrStoreUnavailable)
	_, err = e.s.Fence(ctx, k, 1)
	require.ErrorIs(e.t, err, idempotency.ErrStoreUnavailable)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, e.get(k).GetState())
}

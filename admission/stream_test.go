package admission_test

// Streams hold their slots for their lifetimes (Request.Stream): how a
// running stream counts in the waits the controller predicts.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// TestOneOldStreamDoesNotStretchEveryUnaryWait: a class of 4 slots runs one
// stream that has lived two hours and three unary calls of 10 ms that have
// just started. A unary call with a second to live finds no slot: three
// slots free within 10 ms, so it should queue. The predicted wait spreads
// the stream's two hours over the 4 slots (half an hour) and refuses it
// DEADLINE_UNREACHABLE, counted as overload: a review found that the first
// stream model (a stream's remainder its age) spread the stream's two hours
// over the 4 slots (half an hour) so. A stream now holds its slot out of
// the count instead.
func TestOneOldStreamDoesNotStretchEveryUnaryWait(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ctrl := workController(t, t0, admission.Class{Slots: 4, QueueItems: 8, ExpectedServiceTime: 10 * time.Millisecond})
	ctx := context.Background()
	stream, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Size: -1, Stream: true, Deadline: t0.Add(24 * time.Hour)}, t0)
	require.NoError(t, err)
	defer stream.Abandon()
	now := t0.Add(2 * time.Hour)
	for range 3 {
		p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Get", Size: 1, Deadline: now.Add(time.Second)}, now)
		require.NoError(t, err)
		defer p.Abandon()
	}
	if qerr, refused := refusedOrQueued(t, ctrl, admission.Request{Method: "/s.S/Get", Size: 1, Deadline: now.Add(time.Second)}, now, 1); refused {
		ra, _ := status.RetryAfter(qerr)
		t.Fatalf("a call three 10 ms jobs away from a slot was refused %v (retry-after %v)", status.OutcomeOf(qerr).Reason, ra)
	}
}

// refusedOrQueued asks ctrl to admit r at now and waits until the request
// is answered (refused, so it says: its error and true), or until the
// class "work" holds queued requests; then it withdraws r (cancels its wait
// and waits for it to leave) and returns false.
func refusedOrQueued(t *testing.T, ctrl *admission.Controller, r admission.Request, now time.Time, queued int) (error, bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := ctrl.AdmitAt(ctx, r, now)
		done <- err
	}()
	for {
		select {
		case err := <-done:
			return err, true
		default:
		}
		if s, _ := ctrl.Stats().Class("work"); s.Queued == queued {
			cancel()
			<-done
			return nil, false
		}
		time.Sleep(time.Millisecond)
	}
}

// TestTenantWaitWithAStreamAndAUnaryRunning: tenant a may run 2 requests of
// the class and runs a stream (an hour old) and a unary call (10 ms mean)
// that just started; one request of a waits. The next request of a starts
// when a's unary call and then the waiting one end, about 20 ms; it has a
// second. A review found that tenantStartWaitLocked put it at the stream's
// remainder (j = 1: the second-smallest remainder, as if the starts came
// in rounds) and refused it DEADLINE_UNREACHABLE.
func TestTenantWaitWithAStreamAndAUnaryRunning(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ctrl := workController(t, t0, admission.Class{Slots: 8, QueueItems: 8, TenantRunning: 2,
		ExpectedServiceTime: 10 * time.Millisecond})
	ctx := context.Background()
	stream, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Tenant: "a", Size: -1, Stream: true, Deadline: t0.Add(24 * time.Hour)}, t0)
	require.NoError(t, err)
	defer stream.Abandon()
	now := t0.Add(time.Hour)
	p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Get", Tenant: "a", Size: 1, Deadline: now.Add(time.Second)}, now)
	require.NoError(t, err)
	defer p.Abandon()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	waiting := make(chan error, 1)
	go func() {
		_, err := ctrl.AdmitAt(wctx, admission.Request{Method: "/s.S/Get", Tenant: "a", Size: 1, Deadline: now.Add(time.Second)}, now)
		waiting <- err
	}()
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Queued == 1 }, time.Second, time.Millisecond)
	defer func() { wcancel(); <-waiting }()
	if qerr, refused := refusedOrQueued(t, ctrl, admission.Request{Method: "/s.S/Get", Tenant: "a", Size: 1, Deadline: now.Add(time.Second)}, now, 2); refused {
		t.Fatalf("a request 20 ms of its tenant's work from a start was refused %v", status.OutcomeOf(qerr).Reason)
	}
}

// TestAStreamEndsByItsDeadline: the class's one slot is held by a stream
// that has lived an hour and whose deadline (the handler's context's) is a
// minute away: the slot frees within a minute. A call with five minutes to
// live must queue: a review found it refused DEADLINE_UNREACHABLE and told
// to come back in about an hour, the stream's remainder ignoring its own
// deadline.
func TestAStreamEndsByItsDeadline(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ctrl := workController(t, t0, admission.Class{Slots: 1, QueueItems: 8, ExpectedServiceTime: 10 * time.Millisecond})
	ctx := context.Background()
	now := t0.Add(time.Hour)
	stream, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Size: -1, Stream: true, Deadline: now.Add(time.Minute)}, t0)
	require.NoError(t, err)
	defer stream.Abandon()
	if qerr, refused := refusedOrQueued(t, ctrl, admission.Request{Method: "/s.S/Get", Size: 1, Deadline: now.Add(5 * time.Minute)}, now, 1); refused {
		ra, _ := status.RetryAfter(qerr)
		t.Fatalf("a call with 5 min to live, behind a stream that ends within a minute, was refused %v (retry-after %v)",
			status.OutcomeOf(qerr).Reason, ra)
	}
}

// queueN queues n requests of tenant in the class "work" at now, each
// deadline away, and returns a function that cancels them and waits for
// them to leave.
func queueN(t *testing.T, ctrl *admission.Controller, tenant string, n int, now time.Time, deadline time.Duration) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, n)
	before, _ := ctrl.Stats().Class("work")
	for i := range n {
		go func() {
			_, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Get", Tenant: tenant, Size: 1, Deadline: now.Add(deadline)}, now)
			done <- err
		}()
		require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Queued == before.Queued+i+1 },
			time.Second, time.Millisecond, "request %d of %s was not queued", i, tenant)
	}
	return func() {
		cancel()
		for range n {
			<-done
		}
	}
}

// A saturated tenant (at its running limit, with requests waiting) whose
// running request is a stream: its waiters can start only when the stream
// ends, so their work is none of another tenant's wait, as it was before
// the stream model left streams out of the count (the stream then counted
// as the tenant's held slot, and its queued work came out with it). A
// review found the stream skipped before the held-tenant check: its
// tenant's queued work stayed in the count, spread over the one slot left,
// and a request 10 ms from a start was refused DEADLINE_UNREACHABLE.
func TestSaturatedTenantsStreamKeepsItsQueueOutOfOthersWait(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ctrl := workController(t, t0, admission.Class{Slots: 2, QueueItems: 16, TenantRunning: 1,
		ExpectedServiceTime: 10 * time.Millisecond})
	ctx := context.Background()
	now := t0
	stream, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Tenant: "a", Size: -1, Stream: true, Deadline: now.Add(24 * time.Hour)}, now)
	require.NoError(t, err)
	defer stream.Abandon()
	c, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Get", Tenant: "c", Size: 1, Deadline: now.Add(time.Second)}, now)
	require.NoError(t, err)
	defer c.Abandon()
	stop := queueN(t, ctrl, "a", 10, now, time.Second) // held behind a's stream
	defer stop()

	// b starts when c's 10 ms call ends: a's waiters are held by a's limit.
	if qerr, refused := refusedOrQueued(t, ctrl, admission.Request{Method: "/s.S/Get", Tenant: "b", Size: 1, Deadline: now.Add(60 * time.Millisecond)}, now, 11); refused {
		ra, _ := status.RetryAfter(qerr)
		t.Fatalf("a request 10 ms from a start was refused %v (retry-after %v): tenant a's waiters, held behind its stream, were counted ahead of it",
			status.OutcomeOf(qerr).Reason, ra)
	}
}

// When streams hold every slot, the first to end frees one slot, and the
// queued work runs there until another ends: it is not spread over every
// slot. Four slots: three streams an hour old (each expected to live
// another hour) and one young one (10 ms); 20 calls of 10 ms wait. The
// next call starts after about 10 + 200 ms — the wait predicted when a
// 10 ms unary call holds the young stream's slot instead. A review found it
// predicted 10 + 200/4 ms, so a call with 150 ms to live was queued, to be
// dropped at its deadline, instead of refused at once.
func TestStreamsHoldingEverySlotDoNotSpreadTheQueueOverThem(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	predicted := func(young bool) time.Duration {
		ctrl, err := admission.New(admission.WithClock(func() time.Time { return t0 }),
			admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 32, ExpectedServiceTime: 10 * time.Millisecond}),
			admission.WithDefaultClass("work"))
		require.NoError(t, err)
		defer func() { _ = ctrl.Close() }()
		ctx := context.Background()
		now := t0.Add(time.Hour)
		for range 3 {
			p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Size: -1, Stream: true, Deadline: now.Add(24 * time.Hour)}, t0)
			require.NoError(t, err)
			defer p.Abandon()
		}
		p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Get", Size: 1, Stream: young, Deadline: now.Add(24 * time.Hour)}, now)
		require.NoError(t, err)
		defer p.Abandon()
		stop := queueN(t, ctrl, "", 20, now, time.Hour)
		defer stop()
		s, _ := ctrl.StatsAt(now).Class("work")
		return s.PredictedWait
	}
	unary, stream := predicted(false), predicted(true)
	t.Logf("predicted wait: young unary %v, young stream %v", unary, stream)
	require.GreaterOrEqual(t, stream, 200*time.Millisecond,
		"the queue's 200 ms of work, which runs on the one slot the young stream frees, was spread over all 4 slots (unary in its place: %v)", unary)
}

// An operator lowers a class of 3 slots to 1 while 3 streams run in it:
// a request starts only when the class runs fewer than 1, after all three
// streams end, two of them (an hour old) expected in an hour. A review
// found the wait predicted from the first stream to end (10 ms), as if one
// ending freed a slot, and a call with a second to live queued behind an
// hour's wait.
func TestStreamsAboveLoweredSlotsMustAllEnd(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ctrl := workController(t, t0, admission.Class{Slots: 3, QueueItems: 8, ExpectedServiceTime: 10 * time.Millisecond})
	ctx := context.Background()
	now := t0.Add(time.Hour)
	for _, start := range []time.Time{t0, t0, now} {
		p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Size: -1, Stream: true, Deadline: now.Add(24 * time.Hour)}, start)
		require.NoError(t, err)
		defer p.Abandon()
	}
	_, err := ctrl.SetOverrideAt(ctx, admission.Override{Actor: "op", Reason: "test", TTL: time.Hour, Class: "work", Slots: 1}, now)
	require.NoError(t, err)
	s, _ := ctrl.StatsAt(now).Class("work")
	require.GreaterOrEqual(t, s.PredictedWait, 30*time.Minute,
		"three streams hold a class lowered to one slot: no slot frees before all three end, yet the wait predicted is the first's")
}

// The commit's own scenario (TestSaturatedTenantsStreamKeepsItsQueueOutOfOthersWait)
// with c's 10 ms call swapped for a young stream: now streams hold every
// slot. A review found that playOutLocked played tenant a's ten waiters,
// which can start only after a's hour-old stream ends, onto the slot c's
// stream frees: b, which starts when c's stream ends (~10 ms), was
// predicted 110 ms and refused.
func TestPlayOutLeavesASaturatedTenantsQueueOut(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(time.Hour)
	ctrl := workController(t, now, admission.Class{Slots: 2, QueueItems: 16, TenantRunning: 1,
		ExpectedServiceTime: 10 * time.Millisecond})
	ctx := context.Background()
	a, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Tenant: "a", Size: -1, Stream: true, Deadline: now.Add(24 * time.Hour)}, t0)
	require.NoError(t, err)
	defer a.Abandon()
	c, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Tenant: "c", Size: -1, Stream: true, Deadline: now.Add(24 * time.Hour)}, now)
	require.NoError(t, err)
	defer c.Abandon()
	stop := queueN(t, ctrl, "a", 10, now, 2*time.Hour) // held behind a's stream
	defer stop()

	s, _ := ctrl.StatsAt(now).Class("work")
	t.Logf("predicted wait for another tenant: %v", s.PredictedWait)

	if qerr, refused := refusedOrQueued(t, ctrl, admission.Request{Method: "/s.S/Get", Tenant: "b", Size: 1, Deadline: now.Add(60 * time.Millisecond)}, now, 11); refused {
		ra, _ := status.RetryAfter(qerr)
		t.Fatalf("b, ~10 ms from a start (c's stream's end; a's waiters are held by a's limit), was refused %v (retry-after %v, predicted %v)",
			status.OutcomeOf(qerr).Reason, ra, s.PredictedWait)
	}
}

// DESIGN.md §3.6: refusals are allocation-light. A refusal in a class whose
// slots all hold streams allocates more than the same refusal with unary
// calls on the slots: a review found that playOutLocked built its
// remainders in a fresh slice (twice per refusal: the deadline stage's wait
// and the retry-after).
func TestPlayOutRefusalAllocatesNoMoreThanUnary(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	allocs := func(stream bool) float64 {
		ctrl, err := admission.New(admission.WithClock(func() time.Time { return t0 }),
			admission.WithClasses(admission.Class{Name: "work", Slots: 8, QueueItems: 0, ExpectedServiceTime: 10 * time.Millisecond}),
			admission.WithDefaultClass("work"))
		require.NoError(t, err)
		defer func() { _ = ctrl.Close() }()
		ctx := context.Background()
		for range 8 {
			p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Size: -1, Stream: stream, Deadline: t0.Add(24 * time.Hour)}, t0)
			require.NoError(t, err)
			defer p.Abandon()
		}
		r := admission.Request{Method: "/s.S/Get", Size: 1, Deadline: t0.Add(time.Hour)}
		return testing.AllocsPerRun(200, func() {
			if _, err := ctrl.AdmitAt(ctx, r, t0); err == nil {
				t.Fatal("admitted into a full class")
			}
		})
	}
	unary, stream := allocs(false), allocs(true)
	t.Logf("allocations per refusal: unary on every slot %v, streams on every slot %v", unary, stream)
	require.LessOrEqual(t, stream, unary, "a refusal where streams hold every slot allocates the play-out's slice")
}

// workController is a controller whose one class, "work", is class (its
// name set here), on a test clock that stands at the time now points to.
func workController(t *testing.T, now time.Time, class admission.Class) *admission.Controller {
	t.Helper()
	class.Name = "work"
	ctrl, err := admission.New(admission.WithClock(func() time.Time { return now }),
		admission.WithClasses(class), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	return ctrl
}

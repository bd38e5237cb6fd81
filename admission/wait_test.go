package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

// A release that raises its class's learned service time can leave that
// class's waiters unable to finish by their deadlines: the README promises
// such a waiter is dropped "when a slot frees, a request of its class
// arrives, or (real clock) by its own timer the moment its deadline less the
// service estimate passes". In a class without tenant limits, the release
// drops them only in pumpPass's walk, which stops at the first waiter that
// cannot start; the give-up timer was armed with the old estimate (it is
// re-read only when it fires), so on the real clock it fires late by the
// estimate's rise. Meanwhile the hopeless waiter keeps its place: a class
// whose queue it fills is flagged full, and the tap refuses QUEUE_FULL (and
// counts it as overload) what Admit, which drops the waiter first, queues.
//
// B (1 slot, 2 queued, expected 10ms, learning rate 1) runs B1 on its own
// slot and B2 on L's idle slot; L then queues its own W_L. B queues W_A (no
// deadline) and W_D (deadline t0+60s). At t0+40s B2 is released: B's mean
// becomes 40s, so W_D (t0+40s+40s > t0+60s) can no longer finish. L's slot
// goes to W_L; W_A cannot start, the walk stops there, W_D stays, B's queue
// stays full and its tap flag QUEUE_FULL. Admit of a B request at the same
// instant drops W_D and queues the request.
func TestStaleGiveUpTapRefusesWhatAdmitQueues(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "B", Slots: 1, QueueItems: 2, ExpectedServiceTime: 10 * time.Millisecond, MaxServiceTime: time.Hour},
		admission.Class{Name: "L", Slots: 1, QueueItems: 1, LendIdle: true, ExpectedServiceTime: 10 * time.Millisecond}),
		admission.WithMethods("B", "/demo.B/"), admission.WithMethods("L", "/demo.L/"),
		admission.WithDefaultClass("B"),
		admission.WithLearningRate(1),
		admission.WithStages(admission.AllStages&^admission.StageDegradation))
	b1 := h.admitted(work("/demo.B/Do"))
	defer b1.Abandon()
	b2 := h.admitted(work("/demo.B/Do")) // on L's idle slot
	h.queued(work("/demo.L/Do"))         // W_L: L lends no more
	h.queued(work("/demo.B/Do"))         // W_A
	rd := work("/demo.B/Do")
	rd.Deadline = h.clk.Now().Add(time.Minute)
	h.queued(rd) // W_D

	h.clk.Advance(40 * time.Second)
	h.release(b2) // B learns 40s: W_D cannot finish by t0+60s any more
	for _, r := range h.done {
		if r.permit != nil {
			defer r.permit.Abandon() // W_L, started on L's slot
		}
	}
	st, _ := h.ctrl.Stats().Class("B")
	_, tapErr := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: "/demo.B/Do"})

	id, e := h.arrive(work("/demo.B/Do")) // Admit at the same instant
	if r, ok := h.done[id]; ok && r.permit != nil {
		r.permit.Abandon()
	}
	require.Equal(t, admission.EventQueued, e.Kind, "Admit takes the request: it drops W_D first")
	require.NoError(t, tapErr,
		"the tap refused what Admit queued at the same instant: B's queue held %d (W_D past hope since the release)", st.Queued)
}

// The tap lets requests through once now >= hopeless (the queue's earliest
// deadline less the service estimate), but a waiter that would finish
// exactly at its deadline is not expired (expiredLocked uses After, and the
// README says finishing exactly at the deadline is still useful). At that
// instant Admit drops nothing, refuses QUEUE_FULL and leaves the bound (and
// so hopeless) where it was: the tap then lets through every request for
// as long as the clock reads that instant (a virtual clock can hold it),
// each one refused by Admit — the tap no longer filters anything.
func TestTapOpensAtExactHopelessInstant(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "B", Slots: 1, QueueItems: 1, ExpectedServiceTime: 10 * time.Second}),
		admission.WithDefaultClass("B"),
		admission.WithStages(admission.AllStages&^admission.StageDegradation))
	b1 := h.admitted(work("/demo.B/Do"))
	defer b1.Abandon()
	w := work("/demo.B/Do")
	w.Deadline = epoch.Add(60 * time.Second)
	h.queued(w) // queue full; the waiter can finish by its deadline until t0+50s inclusive

	h.clk.Advance(50 * time.Second) // exactly deadline - service: the waiter can still finish
	passed := 0
	for range 100 {
		if _, err := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: "/demo.B/Do"}); err == nil {
			passed++
		}
		h.refused(work("/demo.B/Do"), status.ReasonQueueFull) // Admit drops nothing: the waiter is not expired
	}
	st, _ := h.ctrl.Stats().Class("B")
	require.Equal(t, 1, st.Queued, "the waiter, able to finish exactly at its deadline, stays")
	require.Zero(t, passed, "the tap let through %d of 100 requests that Admit refused QUEUE_FULL at the same instant", passed)
}

// On the real clock the README promises a waiter is dropped "by its own
// timer the moment its deadline less the service estimate passes". Its
// timer was armed with the estimate when it joined and re-read it only when
// it fired, so a waiter that a release's higher estimate made hopeless a
// little later stayed queued — its caller unanswered, its place held —
// until its deadline less the OLD estimate.
//
// B (2 slots, expected 10ms, learning rate 1) runs b1, b2; W_A (no deadline)
// and W_D (deadline t0+2s) wait. b2 is released at t0+0.75s: B learns
// ~0.75s, W_D (t0+1.5s ≤ t0+2s) is not yet hopeless and W_A takes the slot.
// W_D is hopeless from ~t0+1.25s; the old timer fired at ~t0+1.99s. At
// t0+1.6s (some 0.35s from either) it must have been dropped. Real time is
// what the timers run on.
func TestGiveUpTimerFollowsARisingEstimate(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(
		admission.Class{Name: "B", Slots: 2, QueueItems: 2, ExpectedServiceTime: 10 * time.Millisecond, MaxServiceTime: time.Hour}),
		admission.WithDefaultClass("B"),
		admission.WithLearningRate(1),
		admission.WithStages(admission.AllStages&^admission.StageDegradation))
	require.NoError(t, err)
	defer ctrl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Now()
	b1, err := ctrl.Admit(ctx, work("/demo.B/Do"))
	require.NoError(t, err)
	defer b1.Abandon()
	b2, err := ctrl.Admit(ctx, work("/demo.B/Do"))
	require.NoError(t, err)

	type res struct {
		p   *admission.Permit
		err error
	}
	wa, wd := make(chan res, 1), make(chan res, 1)
	go func() { p, err := ctrl.Admit(ctx, work("/demo.B/Do")); wa <- res{p, err} }()
	waitQueued(t, ctrl, "B", 1)
	rd := work("/demo.B/Do")
	rd.Deadline = t0.Add(2 * time.Second)
	go func() { p, err := ctrl.Admit(ctx, rd); wd <- res{p, err} }()
	waitQueued(t, ctrl, "B", 2)

	time.Sleep(time.Until(t0.Add(750 * time.Millisecond)))
	b2.Release() // B learns ~0.75s; W_A starts on the freed slot
	r := <-wa
	require.NoError(t, r.err)
	defer r.p.Abandon()

	time.Sleep(time.Until(t0.Add(1600 * time.Millisecond)))
	select {
	case r := <-wd:
		require.Error(t, r.err)
	default:
		st, _ := ctrl.Stats().Class("B")
		t.Fatalf("at t0+1.6s W_D (deadline t0+2s, estimate %v since t0+0.75s) is still queued (B queued %d): its timer was armed with the 10ms estimate",
			750*time.Millisecond, st.Queued)
	}
}

// A fresh class (ExpectedServiceTime 10ms) serves 5 requests of 10ms; the
// 6th hangs until the default MaxServiceTime cap (1 min). The estimator
// clips outliers only after clipMinSamples (20) observations, so this one
// moves the mean to ≈12s and the p95 up by 0.95·(mean/10) ≈ 1.15s. The
// class then serves 1000 more requests, every one taking exactly 10ms: the
// mean is back at 10ms, but the p95 only steps down by 0.05·(mean/10) =
// 50µs per observation, so service() = max(p95, mean) still says ≈0.8s
// after 1006 samples of which 1005 took 10ms (their real p95: 10ms). Every
// request that does not find the class idle is refused
// DEADLINE_UNREACHABLE with a 500ms deadline — even with no wait at all —
// for about 16,000 more requests: one hung handler early in a process's
// life locks the class out of all but idle-class probes.
func TestEarlyOutlierLocksClassOut(t *testing.T) {
	clk := newClock()
	ctrl, err := admission.New(admission.WithClock(clk.Now),
		admission.WithClasses(admission.Class{Name: "main", Slots: 4, QueueItems: 4, ExpectedServiceTime: 10 * time.Millisecond}))
	require.NoError(t, err)
	defer ctrl.Close()
	ctx := context.Background()
	serve := func(d time.Duration) {
		p, err := ctrl.AdmitAt(ctx, work("/demo.Main/Do"), clk.Now())
		require.NoError(t, err)
		p.ReleaseAt(clk.Advance(d))
	}
	for range 5 {
		serve(10 * time.Millisecond)
	}
	serve(time.Minute) // one hung handler, at the cap
	for range 1000 {
		serve(10 * time.Millisecond)
	}
	// One request runs (the class is not idle); a second, with 500ms to go
	// and a free slot, needs no wait.
	p1, err := ctrl.AdmitAt(ctx, work("/demo.Main/Do"), clk.Now())
	require.NoError(t, err)
	defer p1.AbandonAt(clk.Now())
	r := work("/demo.Main/Do")
	r.Deadline = clk.Now().Add(500 * time.Millisecond)
	p2, err := ctrl.AdmitAt(ctx, r, clk.Now())
	if err != nil {
		st, _ := ctrl.StatsAt(clk.Now()).Class("main")
		t.Fatalf("1005 of the last 1006 requests took 10ms, a slot is free, 500ms to go, yet refused %v (estimate: mean %v, p95 %v)",
			status.ReasonName(status.OutcomeOf(err).Reason), st.ServiceMean, st.ServiceP95)
	}
	p2.AbandonAt(clk.Now())
}

// AdmitAt with a time more than ~292 years after the controller's epoch
// (a bogus virtual time, a zero-based simulation clock fed real times):
// rollWindows' skip computes (now.Sub(winEnd)/w + 1) * w; now.Sub
// saturates at the maximum Duration, the product overflows to a negative
// Duration, winEnd moves backwards, and the loop never ends — spinning
// under the controller's lock, so every later Admit, Release, tap refresh
// and metric scrape blocks forever. Expected: the call returns (the
// windows are skipped, or the time refused). The failure is a hang, not
// slowness: the bound below is generous.
func TestFarFutureTimeDoesNotWedge(t *testing.T) {
	ctrl, err := admission.New()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p, err := ctrl.AdmitAt(context.Background(), work("/demo.Main/Do"), time.Now().AddDate(300, 0, 0))
		if err == nil {
			p.Abandon()
		}
	}()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case <-done:
		ctrl.Close()
	case <-timer.C:
		t.Fatal("AdmitAt 300 years ahead never returned: rollWindows loops forever under the lock")
	}
}

// Lender L (1 slot, LendIdle, 100 ms) has lent its only slot to class X,
// whose requests take 1 s. L's own request then finds no slot: it cannot
// start before X's borrower ends (~1 s), so with 150 ms to its deadline it
// cannot finish and must be refused DEADLINE_UNREACHABLE on arrival.
// predictedWaitLocked counts only L's own running requests (none) and L's
// queue (empty): a full class predicts a wait of 0, and the request is
// queued, to be dropped DEADLINE_EXPIRED (final) later.
func TestLenderFullyLentPredictsNoWait(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "L", Slots: 1, QueueItems: 4, LendIdle: true, ExpectedServiceTime: 100 * time.Millisecond},
		admission.Class{Name: "X", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}),
		admission.WithMethods("X", "/demo.X/"))
	px := h.admitted(work("/demo.X/Do"))
	defer px.Abandon()
	px2 := h.admitted(work("/demo.X/Do")) // borrows L's idle slot
	defer px2.Abandon()
	before, _ := h.ctrl.Stats().Class("L")
	if before.UsedSlots != 1 {
		t.Fatalf("X's second request did not borrow L's slot: %+v", before)
	}
	r := work("/demo.L/Do")
	r.Deadline = h.clk.Now().Add(150 * time.Millisecond)
	id, e := h.arrive(r)
	if e.Kind != admission.EventRefused {
		t.Fatalf("L's request (150 ms to its deadline, 100 ms of service) behind X's 1 s borrower was %v, want refused DEADLINE_UNREACHABLE (L full, predicted wait %v)", e.Kind, before.PredictedWait)
	}
	if got := status.OutcomeOf(h.take(id).err).Reason; got != status.ReasonDeadlineUnreachable {
		t.Fatalf("refused %v, want DEADLINE_UNREACHABLE", status.ReasonName(got))
	}
}

// A review found that, on the real clock, when an operator lowered class
// X's slots from 2 to 1 for 50 ms while one request ran (long) and a second
// waited, the waiter stayed queued with a slot free once the override
// expired: nothing re-evaluated the controller until some unrelated call
// (an Admit, a Release, Stats) advanced the state. Here nothing else
// happens; the controller now wakes itself at the override's end.
func TestWaiterStartsWhenOverrideExpires(t *testing.T) {
	queued := make(chan struct{}, 1)
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "X", Slots: 2, QueueItems: 4}),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventQueued {
				queued <- struct{}{}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Close()
	ctx := context.Background()
	if _, err := ctrl.SetOverride(ctx, admission.Override{Actor: "op", Reason: "test", TTL: 50 * time.Millisecond, Class: "X", Slots: 1}); err != nil {
		t.Fatal(err)
	}
	p1, err := ctrl.Admit(ctx, admission.Request{Method: "/x.X/Do", Size: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Release()
	got := make(chan error, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		p, err := ctrl.Admit(wctx, admission.Request{Method: "/x.X/Do", Size: -1})
		if p != nil {
			p.Release()
		}
		got <- err
	}()
	<-queued
	timer := time.NewTimer(50*time.Millisecond + 2*time.Second)
	defer timer.Stop()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-timer.C:
		cancel()
		<-got
		t.Fatal("the override lowering X to 1 slot expired 2 s ago and X has a free slot, but its waiter was never started")
	}
}

// Request.StartBy: a request whose caller stops waiting before its work's
// deadline (a recorded unary try, whose handler runs detached until the
// attempt's deadline) is refused DEADLINE_UNREACHABLE when the predicted
// wait ends after it, instead of being queued to be dropped when its caller
// gives up; with time to wait, it is queued as before.
func TestStartByBoundsTheWait(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "A", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}))
	p := h.admitted(work("/demo.A/Do"))
	defer p.Abandon()

	short := work("/demo.A/Do")
	short.Deadline = h.clk.Now().Add(time.Hour)
	short.StartBy = h.clk.Now().Add(10 * time.Millisecond)
	h.refused(short, status.ReasonDeadlineUnreachable)

	long := work("/demo.A/Do")
	long.Deadline = h.clk.Now().Add(time.Hour)
	long.StartBy = h.clk.Now().Add(time.Minute)
	h.queued(long)
	for _, r := range h.done {
		if r.permit != nil {
			r.permit.Abandon()
		}
	}
}

// A review found that a StartBy refusal was remembered for the false-reject judgement with the
// request's Deadline only (rememberReject(cs, r.Deadline, now)), and
// judgeRejects counts it a false reject when a later arrival starts in time
// to finish by that Deadline. But the request had to *start* by StartBy:
// a later arrival that starts long after StartBy shows the refusal was right.
// Every StartBy refusal of a detached recorded try (Deadline = the attempt's,
// StartBy = the try's, much earlier) is thus judged avoidable, inflating
// FalseRejects and tollgate.admission.false_rejects.
func TestStartByRefusalJudgedFalseReject(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "A", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}))
	p := h.admitted(work("/demo.A/Do"))

	h.tick(time.Millisecond)
	short := work("/demo.A/Do")
	short.Deadline = h.clk.Now().Add(time.Hour)
	short.StartBy = h.clk.Now().Add(10 * time.Millisecond)
	h.refused(short, status.ReasonDeadlineUnreachable)

	h.tick(time.Millisecond)
	later := work("/demo.A/Do")
	later.Deadline = h.clk.Now().Add(time.Hour)
	id := h.queued(later)

	// The slot frees 5 s later: the refused request, had it been queued,
	// would have started then, long after its StartBy.
	h.tick(5 * time.Second)
	h.release(p)
	r := h.take(id)
	if r.err != nil {
		t.Fatalf("later request: %v", r.err)
	}
	r.permit.Abandon()
	st, _ := h.ctrl.Stats().Class("A")
	if st.FalseRejects != 0 {
		t.Fatalf("FalseRejects = %d, want 0: the refused request had to start within 10 ms and the slot freed after 5 s", st.FalseRejects)
	}
}

// A request with StartBy and no Deadline (Request's fields; zero: none) is
// refused DEADLINE_UNREACHABLE by the StartBy check and remembered with a
// zero deadline. judgeRejects then asks whether now plus the mean service
// time is after that zero deadline — always true — so the refusal is never
// judged a false reject, even when a later arrival starts within StartBy.
// With any Deadline set, the same sequence counts one false reject.
func TestStartByWithoutDeadlineNeverFalseReject(t *testing.T) {
	for _, withDeadline := range []bool{true, false} {
		name := "deadline"
		if !withDeadline {
			name = "no-deadline"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, admission.WithClasses(
				admission.Class{Name: "A", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}))
			p := h.admitted(work("/demo.A/Do"))

			h.tick(time.Millisecond)
			short := work("/demo.A/Do")
			if withDeadline {
				short.Deadline = h.clk.Now().Add(time.Hour)
			}
			short.StartBy = h.clk.Now().Add(50 * time.Millisecond)
			h.refused(short, status.ReasonDeadlineUnreachable)

			// The slot frees 1 ms later, and a later request starts at once,
			// 2 ms after the refusal: well within the refused one's StartBy.
			h.tick(time.Millisecond)
			h.release(p)
			h.tick(time.Millisecond)
			later := h.admitted(work("/demo.A/Do"))
			later.Abandon()

			st, _ := h.ctrl.Stats().Class("A")
			if st.FalseRejects != 1 {
				t.Fatalf("FalseRejects = %d, want 1: a later request started 2 ms after the refusal, within its 50 ms StartBy (deadline set: %v)", st.FalseRejects, withDeadline)
			}
		})
	}
}

// Class main (2 slots, LendIdle, TenantRunning 1, 100 ms) lent one idle
// slot to class X, whose request runs long. Tenant a then runs R_a in
// main's other slot and queues W: main is full (a saturated: at its limit
// with a waiter). predictedWaitLocked leaves a's running request out and
// takes its slot away — slots 2 − held 1 = 1 — but the slot it spreads the
// rest over is the one X borrowed, whose work is not main's: remaining 0,
// queued 0, so a FULL class predicts NO wait (the doc of overdueShare
// says a full class must never). A request of tenant d with 150 ms to
// spare (100 ms of service) is queued though it cannot start before X's
// request or a's R_a and W end; before 74d2b99 the wait was (100+100)/2 =
// 100 ms and it was refused DEADLINE_UNREACHABLE at once.
func TestFullClassPredictsNoWaitWithALentSlot(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "main", Slots: 2, QueueItems: 10, TenantRunning: 1, LendIdle: true, ExpectedServiceTime: 100 * time.Millisecond},
		admission.Class{Name: "X", Slots: 1, QueueItems: 10, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithMethods("X", "/demo.X/"))
	px := h.admitted(work("/demo.X/Do"))
	defer px.Abandon()
	px2 := h.admitted(work("/demo.X/Do")) // borrows main's idle slot
	defer px2.Abandon()
	a := work("/demo.Main/Do")
	a.Tenant = "a"
	pa := h.admitted(a) // main's last slot
	defer pa.Abandon()
	h.queued(a) // a saturated: at its limit, one waiting
	d := work("/demo.Main/Do")
	d.Tenant = "d"
	d.Deadline = h.clk.Now().Add(150 * time.Millisecond)
	id, e := h.arrive(d)
	if e.Kind != admission.EventRefused {
		t.Fatalf("d (150 ms to spare, 100 ms of service) was %v in a full class (X's borrowed slot, a's R_a; a's W ahead): predicted wait 0", e.Kind)
	}
	if r := status.OutcomeOf(h.take(id).err).Reason; r != status.ReasonDeadlineUnreachable {
		t.Fatalf("refused %v, want DEADLINE_UNREACHABLE", status.ReasonName(r))
	}
}

// Classes B (1 slot) and L (2 slots, LendIdle, TenantRunning 1), in that
// order. Tenant t runs R_t in L and queues W_t (held by t's limit: L has a
// slot idle, but a class with a waiter does not lend). B runs B1 and queues
// B2, which cannot borrow L's idle slot while W_t waits. R_t ends: pump
// walks B first (L still has W_t: no lending, B2 skipped), then L, where W_t
// starts and L's queue empties. L now has an idle slot and no waiter — it
// lends — yet B2 stays queued, because pump made one pass over the classes
// and B came before L. Nothing pumps again until some later event: the next
// B request (B3) is admitted on L's idle slot at once, ahead of B2, which
// has been waiting in B's FIFO all along.
func TestPumpSinglePassLeavesBorrowerQueued(t *testing.T) {
	h, pt, wt, b2 := lenderWithHeldWaiter(t)
	h.release(pt) // W_t starts; L's queue empties, one L slot idle and lendable
	if r := h.take(wt); r.err != nil {
		t.Fatalf("W_t: %v", r.err)
	} else {
		defer r.permit.Abandon()
	}
	if r, ok := h.done[b2]; ok {
		r.permit.Abandon()
		return // B2 started on L's idle slot: correct
	}
	id, e := h.arrive(work("/demo.B/Do"))
	if e.Kind == admission.EventAdmitted {
		h.take(id).permit.Abandon()
		t.Fatalf("after R_t ended, L had an idle lendable slot but B2 (queued first) stayed queued; a later B request B3 was admitted at once on it, ahead of B2 (FIFO broken, slot idle while work waited)")
	}
	t.Fatalf("B2 stayed queued with L's slot idle and lendable (B3: %v)", e.Kind)
}

// lenderWithHeldWaiter builds the state both regression8 lending tests start
// from: class B (1 slot) before lender L (2 slots, LendIdle, TenantRunning
// 1); tenant t runs R_t (pt) in L and queues W_t (wt), held by t's limit, so
// that L, having a waiter, lends none of its idle slot; B runs B1 (abandoned
// at cleanup) and queues B2 (b2).
func lenderWithHeldWaiter(t *testing.T) (h *harness, pt *admission.Permit, wt, b2 int) {
	h = newHarness(t, admission.WithClasses(
		admission.Class{Name: "B", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond},
		admission.Class{Name: "L", Slots: 2, QueueItems: 4, TenantRunning: 1, LendIdle: true, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithMethods("B", "/demo.B/"), admission.WithMethods("L", "/demo.L/"),
		admission.WithDefaultClass("L"))
	rt := work("/demo.L/Do")
	rt.Tenant = "t"
	pt = h.admitted(rt)
	wt = h.queued(rt) // held by t's running limit; L's second slot idle
	pb1 := h.admitted(work("/demo.B/Do"))
	t.Cleanup(pb1.Abandon)
	b2 = h.queued(work("/demo.B/Do")) // L has a waiter: no lending
	return h, pt, wt, b2
}

// On a virtual clock a waiter whose context ends left without a pump
// (still so on AdmitAt's clock; review 13 made it pump on the
// controller's own clock, WithClock's, as on the real one):
// "A virtual clock's time is the caller's to give (AdmitAt, ReleaseAt): its
// pumps wait for the caller's next call" (ctxEnded). But the next call,
// Admit, pumps only when it dropped an expired waiter of its own class
// (decideLocked), so it does not start the waiters that the leaving let
// start: it takes the freed slot itself, ahead of them.
//
// L (2 slots, LendIdle, TenantRunning 1): tenant t runs R_t and queues W_t
// (held by t's limit; L, having a waiter, does not lend its idle slot). B
// (1 slot) runs B1 and queues B2. W_t's caller cancels: L's queue is empty,
// its idle slot lendable. The next call is a new B request B3: it is
// admitted on L's slot at once, while B2, first in B's FIFO, keeps waiting.
func TestVirtualClockNextAdmitOvertakesWaiter(t *testing.T) {
	h, pt, wt, b2 := lenderWithHeldWaiter(t)
	defer pt.Abandon()
	h.cancel(wt) // L's queue empties: its idle slot is lendable
	if r, ok := h.done[b2]; ok {
		r.permit.Abandon()
		return
	}
	id, e := h.arrive(work("/demo.B/Do")) // the caller's next call
	if r, ok := h.done[b2]; ok {
		r.permit.Abandon()
	}
	if e.Kind == admission.EventAdmitted {
		h.take(id).permit.Abandon()
		if _, ok := h.done[b2]; !ok {
			t.Fatalf("B3 was admitted on L's idle slot while B2, queued before it, still waits")
		}
	}
}

// A waiter that can no longer finish by its deadline (its deadline less the
// class's service estimate has passed) gives up by a timer of its own and is
// refused DEADLINE_EXPIRED while its caller still listens; before, it waited
// until its caller's context ended (found by review). The refusal does not
// wrap the context's error: the context had not ended.
func TestWaiterGivesUpOnceItCannotFinish(t *testing.T) {
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 1,
		ExpectedServiceTime: 100 * time.Millisecond}), admission.WithDefaultClass("work"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.Admit(context.Background(), admission.Request{Method: "/a/b"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	deadline := time.Now().Add(600 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_, err = c.Admit(ctx, admission.Request{Method: "/a/b", Deadline: deadline})
	o := status.OutcomeOf(err)
	if o.Kind != status.KindNotAdmitted || o.Reason != status.ReasonDeadlineExpired {
		t.Fatalf("queued past the point it could finish: %v, want NOT_ADMITTED DEADLINE_EXPIRED", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the waiter waited for its caller's context to end: %v", err)
	}
	if s, _ := c.Stats().Class("work"); s.Queued != 0 {
		t.Fatalf("the waiter still holds its place: %+v", s)
	}
}

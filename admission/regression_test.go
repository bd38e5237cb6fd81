package admission_test

// Regression tests for the defects of review 3. They run on a virtual clock
// and assert on decisions and counts, never on elapsed time.

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

func newCtl(t *testing.T, clk *clock, opts ...admission.Option) *admission.Controller {
	t.Helper()
	c, err := admission.New(append([]admission.Option{admission.WithClock(clk.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// R4 (P0-2): one huge service-time sample (there was no MaxServiceTime by
// default) poisoned the estimator; with the deadline stage every later request
// was refused DEADLINE_UNREACHABLE even on an idle class, so nothing ever
// completed and the estimate never recovered. Now the sample is capped and an
// idle class admits a probe on ExpectedServiceTime.
func TestRegressionEstimatorPoisonLocksClassOut(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 8, QueueItems: 8, ExpectedServiceTime: 10 * time.Millisecond}))
	p, err := c.Admit(context.Background(), work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour) // e.g. a long-lived stream or a hung handler in the class
	p.Release()
	for i := range 1000 {
		clk.Advance(time.Second)
		r := work("/s.S/M")
		r.Deadline = clk.Now().Add(5 * time.Second)
		p, err := c.Admit(context.Background(), r)
		if err == nil {
			clk.Advance(10 * time.Millisecond)
			p.Release()
			return
		}
		if i == 999 {
			st, _ := c.Stats().Class("w")
			t.Fatalf("idle class refuses every 5s-deadline request for 1000s: %v (mean %v p95 %v, running %d)",
				status.ReasonName(status.OutcomeOf(err).Reason), st.ServiceMean, st.ServiceP95, st.Running)
		}
	}
}

// R8 (P2-9): permits ended without real work (refused/replayed after
// admission) taught ~0 service time: 20 such releases erased a 1s estimate.
// Abandon gives the slot back without teaching the estimator.
func TestRegressionEstimatorPoisonedByInstantReleases(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 8, QueueItems: 8, ExpectedServiceTime: time.Second}))
	for range 20 {
		p, _ := c.Admit(context.Background(), work("/s.S/M"))
		p.Abandon() // e.g. interceptor: beginTry answered from the record after the permit was taken
	}
	st, _ := c.Stats().Class("w")
	if st.ServiceMean < 100*time.Millisecond {
		t.Fatalf("service mean fell from 1s to %v (p95 %v) with no real work", st.ServiceMean, st.ServiceP95)
	}
}

// Abandon and Release end a permit exactly once together, whichever comes
// first; both are nil-safe, and so is Class.
func TestRegressionAbandonExactlyOnce(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 1, ExpectedServiceTime: time.Second}))
	var nilPermit *admission.Permit
	nilPermit.Abandon()
	nilPermit.Release()
	if got := nilPermit.Class(); got != "" {
		t.Fatalf("nil permit's class %q", got)
	}
	for _, abandonFirst := range []bool{true, false} {
		p, err := c.Admit(context.Background(), work("/s.S/M"))
		if err != nil {
			t.Fatal(err)
		}
		if p.Class() != "w" {
			t.Fatalf("class %q", p.Class())
		}
		clk.Advance(time.Hour)
		if abandonFirst {
			p.Abandon()
			p.Release()
		} else {
			p.Release()
			p.Abandon()
		}
		p.Abandon()
		st, _ := c.Stats().Class("w")
		if st.UsedSlots != 0 || st.Running != 0 {
			t.Fatalf("abandonFirst=%v: %d used, %d running after ending twice", abandonFirst, st.UsedSlots, st.Running)
		}
		if abandonFirst && st.ServiceMean != time.Second {
			t.Fatalf("abandoned permit taught the estimator: mean %v", st.ServiceMean)
		}
	}
	// The one Release (an hour, capped at DefaultMaxServiceTime) moved the
	// estimate by a bounded step.
	st, _ := c.Stats().Class("w")
	if st.ServiceMean > admission.DefaultMaxServiceTime || st.ServiceP95 > admission.DefaultMaxServiceTime {
		t.Fatalf("estimate above the default cap: mean %v p95 %v", st.ServiceMean, st.ServiceP95)
	}
}

// One huge sample after many ordinary ones is clipped at 4 × p95.
func TestRegressionEstimatorClipsOutlier(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 1, ExpectedServiceTime: 100 * time.Millisecond}))
	for range 30 {
		p, err := c.Admit(context.Background(), work("/s.S/M"))
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(100 * time.Millisecond)
		p.Release()
	}
	p, _ := c.Admit(context.Background(), work("/s.S/M"))
	clk.Advance(50 * time.Second)
	p.Release()
	st, _ := c.Stats().Class("w")
	// Clipped to 400ms: mean ≤ 100ms + 0.2 × 300ms.
	if st.ServiceMean > 200*time.Millisecond {
		t.Fatalf("one 50s sample moved the mean to %v", st.ServiceMean)
	}
}

// R13 (P1-3): refusals made by the tap are invisible to the degradation windows:
// with the tap installed (interceptor default) a saturated class whose
// arrivals are all refused early never makes a window overloaded.
func TestRegressionTapRefusalsInvisibleToDegradation(t *testing.T) {
	for _, viaTap := range []bool{false, true} {
		clk := newClock()
		c := newCtl(t, clk,
			admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 1},
				admission.Class{Name: "opt", Slots: 8, Optional: true}),
			admission.WithMethods("opt", "/demo.Opt/"))
		ctx, cancel := context.WithCancel(context.Background())
		p, _ := c.Admit(ctx, work("/demo.Main/Do"))
		go c.Admit(ctx, work("/demo.Main/Do"))
		for c.Stats().Classes[1].Queued < 1 {
			time.Sleep(time.Millisecond)
		}
		refused := 0
		for range 100 {
			var err error
			if viaTap {
				_, err = c.TapHandle(ctx, &tap.Info{FullMethodName: "/demo.Main/Do"})
			} else {
				_, err = c.Admit(ctx, work("/demo.Main/Do"))
			}
			if err != nil {
				refused++
			}
		}
		clk.Advance(time.Second)
		t.Logf("viaTap=%v: %d/100 refused QUEUE_FULL, mode after the window: %v", viaTap, refused, c.Mode())
		if viaTap && c.Mode() == admission.ModeNormal {
			t.Errorf("100%% of arrivals refused by the tap, mode stays NORMAL")
		}
		if st, _ := c.Stats().Class("main"); st.Refused["QUEUE_FULL"] < 100 {
			t.Errorf("viaTap=%v: Stats counts %d QUEUE_FULL refusals of 100", viaTap, st.Refused["QUEUE_FULL"])
		}
		cancel()
		p.Release()
	}
}

// R11 (P1-4): one tenant sending already-expired (or unreachable) requests to an
// idle server makes the window "overloaded": the controller degrades and
// sheds every tenant's optional class, with no capacity pressure at all.
func TestRegressionExpiredArrivalsDegradeIdleServer(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 8, QueueItems: 8, TenantQueued: 1},
			admission.Class{Name: "opt", Slots: 8, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"))
	for range 20 {
		r := admission.Request{Method: "/demo.Main/Do", Tenant: "evil", Size: -1, Deadline: clk.Now().Add(-time.Millisecond)}
		_, _ = c.Admit(context.Background(), r)
	}
	clk.Advance(time.Second)
	_, err := c.Admit(context.Background(), admission.Request{Method: "/demo.Opt/Do", Tenant: "good", Size: -1})
	st, _ := c.Stats().Class("main")
	t.Logf("main running %d queued %d; mode %v", st.Running, st.Queued, c.Mode())
	if err != nil {
		t.Fatalf("idle server sheds tenant good's optional request: %v", err)
	}
}

// P1-4: deadlines too short for the service time even without a wait are the
// caller's problem too; they do not degrade an idle server.
func TestRegressionUnreachableWithoutWaitDoesNotDegrade(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 8, QueueItems: 8, ExpectedServiceTime: time.Second},
			admission.Class{Name: "opt", Slots: 8, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"))
	for range 50 {
		r := admission.Request{Method: "/demo.Main/Do", Size: -1, Deadline: clk.Now().Add(time.Millisecond)}
		_, err := c.Admit(context.Background(), r)
		if o := status.OutcomeOf(err); o.Reason != status.ReasonDeadlineUnreachable {
			t.Fatalf("reason %v, want DEADLINE_UNREACHABLE", status.ReasonName(o.Reason))
		}
	}
	clk.Advance(time.Second)
	if m := c.Mode(); m != admission.ModeNormal {
		t.Fatalf("idle server degraded by short deadlines: %v", m)
	}
	if st, _ := c.Stats().Class("main"); st.Refused["DEADLINE_UNREACHABLE"] != 50 {
		t.Fatalf("stats count %d refusals of 50", st.Refused["DEADLINE_UNREACHABLE"])
	}
}

// R3 (P1-5): lending bypasses an override that lowers a class's slots.
func TestRegressionLendingBypassesSlotOverride(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "a", Slots: 4}, admission.Class{Name: "b", Slots: 4, LendIdle: true}),
		admission.WithMethods("b", "/b.B/"))
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "lower a", TTL: time.Minute, Class: "a", Slots: 1}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for range 5 {
		if p, err := c.Admit(context.Background(), work("/a.A/M")); err == nil {
			defer p.Release()
			n++
		}
	}
	if n > 1 {
		t.Fatalf("class a lowered to 1 slot by the operator runs %d requests", n)
	}
}

// R3b (P1-5): in Recovering an optional class borrows lenders' idle slots, bypassing
// the stepped re-admission (⌈Slots·h/ExitAfter⌉).
func TestRegressionRecoveringStepBypassedByLending(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 8, LendIdle: true},
			admission.Class{Name: "opt", Slots: 6, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"))
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Minute, Mode: admission.ModeRecovering}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for range 20 {
		if p, err := c.Admit(context.Background(), work("/demo.Opt/Do")); err == nil {
			defer p.Release()
			n++
		}
	}
	st, _ := c.Stats().Class("opt")
	if n > st.Slots {
		t.Fatalf("recovering optional class stepped to %d slots runs %d requests", st.Slots, n)
	}
}

// R2 (P1-6): an override that lowers QueueItems leaves the queue above the new bound.
func TestRegressionOverrideLowersQueueBelowQueued(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 1, QueueItems: 4}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := c.Admit(ctx, work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	for range 4 {
		go c.Admit(ctx, work("/s.S/M"))
	}
	for c.Stats().Classes[1].Queued < 4 {
		time.Sleep(time.Millisecond)
	}
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Minute, Class: "w", QueueItems: 1}); err != nil {
		t.Fatal(err)
	}
	st, _ := c.Stats().Class("w")
	if st.Queued > st.QueueLimit {
		t.Fatalf("queued %d > effective queue bound %d after override", st.Queued, st.QueueLimit)
	}
	if st.Refused["QUEUE_FULL"] != 3 {
		t.Fatalf("%d waiters refused QUEUE_FULL, want the 3 newest", st.Refused["QUEUE_FULL"])
	}
}

// R1 (P2-7): an override that freezes a class is enforced by the tap forever when the
// class's only traffic is refused at the tap: nothing calls advance, so the
// override never expires and the tap flag is never refreshed.
func TestRegressionTapOverrideNeverExpires(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "batch", Slots: 2, QueueItems: 2}))
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Second, Class: "batch", Freeze: true}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour) // TTL long gone
	_, err := c.TapHandle(context.Background(), &tap.Info{FullMethodName: "/svc.S/M"})
	if err != nil {
		t.Fatalf("tap still refuses an hour after a 1s override expired: %v", err)
	}
	// The request the tap let through reaches Admit, which expires the
	// override; the tap's flag is then open for good.
	p, err := c.Admit(context.Background(), work("/svc.S/M"))
	if err != nil {
		t.Fatalf("Admit after the override expired: %v", err)
	}
	p.Release()
	if _, err := c.TapHandle(context.Background(), &tap.Info{FullMethodName: "/svc.S/M"}); err != nil {
		t.Fatalf("tap refuses after Admit expired the override: %v", err)
	}
}

// P2-7: while an override is in force the tap refuses; only past its expiry
// does it let requests through.
func TestRegressionTapRefusesUntilOverrideExpires(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "batch", Slots: 2, QueueItems: 2}))
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Minute, Class: "batch", Freeze: true}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(59 * time.Second)
	if _, err := c.TapHandle(context.Background(), &tap.Info{FullMethodName: "/svc.S/M"}); status.OutcomeOf(err).Reason != status.ReasonShed {
		t.Fatalf("tap during the freeze: %v, want SHED", err)
	}
	if n := len(c.Overrides()); n != 1 {
		t.Fatalf("%d overrides in force, want 1", n)
	}
}

// R1b (P2-7): Overrides() reports an expired override as in force.
func TestRegressionOverridesListsExpired(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk)
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Second, Class: "default", Slots: 1}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if n := len(c.Overrides()); n != 0 {
		t.Fatalf("Overrides() lists %d override(s) an hour after a 1s TTL", n)
	}
}

// R7 (P2-8): the summed remaining-work estimate lets one overdue request cancel the
// remaining work of the others: a full class predicts a zero wait.
func TestRegressionPredictedWaitCancelsOut(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 2, QueueItems: 2, ExpectedServiceTime: time.Second}))
	p1, _ := c.Admit(context.Background(), work("/s.S/M"))
	defer p1.Release()
	clk.Advance(10 * time.Second) // p1 overdue by 9s
	p2, _ := c.Admit(context.Background(), work("/s.S/M"))
	defer p2.Release()
	st, _ := c.Stats().Class("w")
	t.Logf("running %d/%d, predicted wait %v", st.Running, st.Slots, st.PredictedWait)
	// per-request clamp: (max(1s-10s, 0.1s) + max(1s-0, 0.1s)) / 2 = 550ms
	if st.PredictedWait != 550*time.Millisecond {
		t.Fatalf("full class predicts wait %v, want 550ms: p2 alone has 1s left on 2 slots", st.PredictedWait)
	}
	r := work("/s.S/M")
	r.Deadline = clk.Now().Add(1100 * time.Millisecond)
	_, err := c.Admit(context.Background(), r)
	if o := status.OutcomeOf(err); o.Reason != status.ReasonDeadlineUnreachable {
		t.Fatalf("request needing 1s after a 550ms wait with 1.1s left: %v, want DEADLINE_UNREACHABLE", err)
	}
	// Both overdue: a full class still predicts a wait.
	clk.Advance(10 * time.Second)
	if st, _ := c.Stats().Class("w"); st.PredictedWait <= 0 {
		t.Fatalf("full class of overdue requests predicts wait %v", st.PredictedWait)
	}
}

// R10 (P3-11): under an O,H oscillation the optional class is re-admitted and shed
// again every window (mode changes every window), flushing its queue each time.
func TestRegressionDegradedRecoveringFlap(t *testing.T) {
	h := degradeHarness(t, 1, 3)
	var modes []string
	for i := range 12 {
		modes = append(modes, h.window(i%2 == 0).String())
	}
	tr := h.ctrl.Stats().Transitions
	t.Logf("modes %v, transitions %d in 12 windows", modes, tr)
	if tr > 12/3+1 {
		t.Fatalf("optional-class capacity changed %d times in 12 windows (exit period 3)", tr)
	}
}

// P3-11: after falling back from Recovering the controller holds Degraded for
// the exit period, then recovers in steps as usual.
func TestRegressionDegradedHoldsAfterReentry(t *testing.T) {
	h := degradeHarness(t, 1, 3)
	want := []admission.Mode{
		admission.ModeDegraded,   // O
		admission.ModeRecovering, // H
		admission.ModeDegraded,   // O: re-entry
		admission.ModeDegraded,   // H 1 of 3: held
		admission.ModeDegraded,   // H 2 of 3: held
		admission.ModeRecovering, // H 3 of 3: recover in steps
		admission.ModeRecovering, // H
		admission.ModeNormal,     // H
	}
	for i, w := range want {
		if m := h.window(i == 0 || i == 2); m != w {
			t.Fatalf("window %d: mode %v, want %v", i, m, w)
		}
	}
}

// R12 (P3-10): TENANT_LIMIT's retry-after reflects the class, not the tenant's own
// backlog: the tenant cannot be admitted for ~10s but is told ~2.5s.
func TestRegressionTenantLimitRetryAfter(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 8, QueueItems: 8, TenantRunning: 1, TenantQueued: 1, ExpectedServiceTime: 10 * time.Second}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := admission.Request{Method: "/s.S/M", Tenant: "A", Size: -1}
	p, _ := c.Admit(ctx, a)
	defer p.Release()
	go c.Admit(ctx, a)
	for c.Stats().Classes[1].Queued < 1 {
		time.Sleep(time.Millisecond)
	}
	// The tenant's one running request has 10s left on its running limit
	// of 1: every retry-after is jittered in [5s, 15s).
	for range 50 {
		_, err := c.Admit(ctx, a)
		if o := status.OutcomeOf(err); o.Reason != status.ReasonTenantLimit {
			t.Fatalf("reason %v, want TENANT_LIMIT", status.ReasonName(o.Reason))
		}
		if ra, _ := status.RetryAfter(err); ra < 5*time.Second || ra >= 15*time.Second {
			t.Fatalf("TENANT_LIMIT retry-after %v; tenant A's next queue place frees in ~10s", ra)
		}
	}
}

// R9: a waiter whose deadline passed keeps its queue place (no timer, no
// sweep on Admit): later useful work is refused QUEUE_FULL.
func TestRegressionExpiredWaiterHoldsQueue(t *testing.T) {
	for _, stages := range []admission.Stage{admission.AllStages, admission.AllStages &^ admission.StageDegradation} {
		expiredWaiterHoldsQueue(t, stages)
	}
}

func expiredWaiterHoldsQueue(t *testing.T, stages admission.Stage) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 1, QueueItems: 1, ExpectedServiceTime: 10 * time.Millisecond}), admission.WithStages(stages))
	p, _ := c.Admit(context.Background(), work("/s.S/M"))
	defer p.Release()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := work("/s.S/M")
	r.Deadline = clk.Now().Add(time.Second)
	go c.Admit(ctx, r)
	for c.Stats().Classes[1].Queued < 1 {
		time.Sleep(time.Millisecond)
	}
	clk.Advance(time.Hour)
	r2 := work("/s.S/M")
	r2.Deadline = clk.Now().Add(time.Hour)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	_, err := c.Admit(ctx2, r2)
	if o := status.OutcomeOf(err); o.Reason == status.ReasonQueueFull {
		t.Fatalf("useful request refused QUEUE_FULL: the only queue place is held by a waiter expired 1h ago")
	}
}

// P2-7: the tap's SHED for an optional class while Degraded does not outlive
// the healthy windows that end it when only the tap sees traffic.
func TestRegressionTapShedEndsWithDegradedWindows(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 4, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 2}))
	p, err := c.Admit(context.Background(), work("/demo.Main/Do"))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, _ = c.Admit(context.Background(), work("/demo.Main/Do")) // CONCURRENCY_FULL
	}
	p.Release()
	clk.Advance(time.Second)
	if m := c.Mode(); m != admission.ModeDegraded {
		t.Fatalf("mode %v, want DEGRADED", m)
	}
	info := &tap.Info{FullMethodName: "/demo.Opt/Do"}
	if _, err := c.TapHandle(context.Background(), info); status.OutcomeOf(err).Reason != status.ReasonShed {
		t.Fatalf("tap while degraded: %v, want SHED", err)
	}
	clk.Advance(10 * time.Second) // healthy windows nobody has closed yet
	if _, err := c.TapHandle(context.Background(), info); err != nil {
		t.Fatalf("tap still sheds after 10 healthy windows: %v", err)
	}
	q, err := c.Admit(context.Background(), work("/demo.Opt/Do"))
	if err != nil {
		t.Fatalf("Admit after the healthy windows: %v", err)
	}
	q.Release()
}

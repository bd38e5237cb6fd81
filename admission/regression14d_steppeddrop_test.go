package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Waiters of an optional class that queue behind Recovering's lowered slots
// and run out of time while the class is stepped are dropped, on the
// virtual clock, only by the next pump: the one at the end of the roll that
// ends the step (rollWindows steps to Normal first, then pumps). The drop
// is then judged unstepped (countRefusal reads c.stepped now) and counts as
// two DEADLINE_EXPIRED overload refusals in the first Normal window, which
// throws the controller straight back to Degraded — although the waits and
// the expiry were entirely the step's (the real clock's per-waiter timer
// would have dropped them while the class was stepped, uncounted).
func TestRegression14dAdmission14SteppedExpiryCountsAfterTheStep(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, QueueItems: 3, Optional: true, ExpectedServiceTime: 10 * time.Millisecond},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
		}))
	// Window 1: main overloaded → Degraded; window 2 healthy → Recovering.
	p := h.admitted(work(mainM))
	h.refused(work(mainM), status.ReasonConcurrencyFull)
	h.release(p)
	h.tick(time.Second)
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeRecovering {
		t.Fatalf("mode %v, want RECOVERING", m)
	}
	// Window 3 healthy: the step grows to 2 slots.
	h.tick(time.Second)
	if st, _ := h.ctrl.Stats().Class("opt"); st.Slots != 2 || h.ctrl.Mode() != admission.ModeRecovering {
		t.Fatalf("opt slots %d mode %v, want 2 RECOVERING", st.Slots, h.ctrl.Mode())
	}
	opt := func(d time.Duration) admission.Request {
		r := work(optM)
		r.Deadline = h.clk.Now().Add(d)
		return r
	}
	a1 := h.admitted(opt(time.Minute))
	defer a1.Abandon()
	a2 := h.admitted(opt(time.Minute))
	defer a2.Abandon()
	// Two more, within the class's 3 configured slots, wait behind the
	// step's 2 and run out of time half-way through window 4.
	b := h.queued(opt(500 * time.Millisecond))
	c := h.queued(opt(500 * time.Millisecond))
	// Window 4 healthy: Normal, the step ends; b and c are dropped.
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("mode %v, want NORMAL", m)
	}
	for _, id := range []int{b, c} {
		if r := h.take(id); r.err == nil {
			r.permit.Abandon()
			t.Fatalf("waiter %d started; want it dropped", id)
		}
	}
	for _, e := range h.log {
		if e.Kind == admission.EventDropped || e.Kind == admission.EventMode {
			t.Logf("%v %v %v at %v", e.Kind, e.Mode, status.ReasonName(e.Reason), e.At.Sub(epoch))
		}
	}
	// Window 5: nothing arrives, main idle.
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("first Normal window, main idle, no new load: mode %v, want NORMAL (the drops Recovering's step caused counted once the step ended)", m)
	}
}

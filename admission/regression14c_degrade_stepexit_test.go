package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A review found that Recovering's step left the waits it causes out of every window, but only
// while the class is stepped: the requests that queued behind the lowered
// slots start when the step ends (the mode becomes Normal and pump starts
// them in the same roll), and deg.started then counts their whole wait —
// a wait the step alone caused — in the first Normal window. With
// MaxQueueAge set, that window is overloaded and the controller goes
// straight back to Degraded, although the optional load (3 requests) never
// exceeded the class's 3 configured slots: the doc promises the cycling
// only for a load that exceeds even the configured slots.
func TestRegression14cSteppedWaitCountsOnceTheStepEnds(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, QueueItems: 3, Optional: true},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
			MaxQueueAge: 200 * time.Millisecond,
		}))
	// Window 1: main overloaded → Degraded.
	p := h.admitted(work(mainM))
	h.refused(work(mainM), status.ReasonConcurrencyFull)
	h.release(p)
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeDegraded {
		t.Fatalf("mode %v, want DEGRADED", m)
	}
	// Window 2 healthy → Recovering, opt stepped to 1 slot.
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeRecovering {
		t.Fatalf("mode %v, want RECOVERING", m)
	}
	opt := func() admission.Request {
		r := work(optM)
		r.Deadline = h.clk.Now().Add(time.Minute)
		return r
	}
	a := h.admitted(opt())
	defer a.Abandon()
	b := h.queued(opt())
	c := h.queued(opt())
	// Windows 3 and 4 healthy: the step grows to 2 slots (b starts), then
	// the controller is Normal with 3 slots (c starts, after a 2 s wait
	// the step caused).
	h.tick(time.Second)
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("mode %v, want NORMAL", m)
	}
	for _, id := range []int{b, c} {
		r := h.take(id)
		if r.err != nil {
			t.Fatalf("waiter %d: %v", id, r.err)
		}
		defer r.permit.Abandon()
	}
	for _, e := range h.log {
		if e.Kind == admission.EventStarted || e.Kind == admission.EventMode {
			t.Logf("%v %v waited %v at %v", e.Kind, e.Mode, e.Waited, e.At.Sub(epoch))
		}
	}
	// Window 5: nothing arrives, nothing waits; main idle.
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("first Normal window with nothing waiting and main idle: mode %v, want NORMAL (the wait Recovering's step caused counted once the step ended)", m)
	}
}

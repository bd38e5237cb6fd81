package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Class main: 2 slots, TenantRunning 1, 100 ms of service. Tenants b and x
// run one request each (the class is full) and b has 10 more requests
// waiting. b can run only one request at a time, so its waiters only ever
// take the slot b's own running request frees: pump skips them while b is
// at its limit. Tenant c's request therefore starts when x's request ends
// (+100 ms) and finishes at +200 ms, within its +300 ms deadline. But
// predictedWaitLocked spreads ALL queued work, b's 10 × 100 ms included, over
// the 2 slots: (1000 + 200) / 2 = 600 ms, and c is refused
// DEADLINE_UNREACHABLE — a false reject, and one counted as overload in the
// degradation window (wait != 0, not held by c's tenant), so one tenant's
// backlog behind its own running limit is booked as the server's overload.
func TestRegression5OtherTenantsHeldBacklogDoesNotInflateTheWait(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "main", Slots: 2, QueueItems: 20, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 1, MaxRefusalRatio: 0.2, EnterAfter: 1}))
	req := func(tn string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tn; return r }
	pb := h.admitted(req("b"))
	px := h.admitted(req("x"))
	var backlog []int
	for range 10 {
		backlog = append(backlog, h.queued(req("b")))
	}
	c := req("c")
	c.Deadline = h.clk.Now().Add(300 * time.Millisecond)
	id, e := h.arrive(c)
	if e.Kind == admission.EventRefused {
		st, _ := h.ctrl.Stats().Class("main")
		reason := status.ReasonName(status.OutcomeOf(h.take(id).err).Reason)
		h.tick(time.Second) // the window with the refusal closes (2 starts, 1 refusal)
		t.Fatalf("c refused %s (predicted wait %v) although it starts when x's request ends at +100 ms and finishes at +200 ms of 300; mode after the window: %v",
			reason, st.PredictedWait, h.ctrl.Mode())
	}
	// Correct behaviour: c waits, and starts when x's request ends.
	h.clk.Advance(100 * time.Millisecond)
	h.release(pb) // b's first waiter takes b's slot
	h.release(px) // c takes x's slot: b is at its limit again
	r := h.take(id)
	if r.err != nil {
		t.Fatalf("c: %v", r.err)
	}
	r.permit.Abandon()
	h.drain()
	_ = backlog
}

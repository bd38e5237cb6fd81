package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// 7f5cab0 stops remembering a DEADLINE_UNREACHABLE refusal "caused by the
// tenant's own running work" (tenantCaused), but only when the class's wait
// alone would have fit. A request whose tenant is at its running limit in a
// full class, with a deadline that its tenant's wait alone already makes
// unreachable, is still remembered whenever the class's wait does not fit
// either — and judgeRejects then counts it a false reject as soon as another
// tenant's earlier waiter starts early, ignoring that the refused request
// could not have started before its own tenant's running request ended.
//
// main: 2 slots, TenantRunning 1, 100 ms. a runs R_a, b runs R_b (full); c
// queues W_c. a2 (deadline +150 ms) is refused: class wait 150 ms, tenant
// wait 100 ms (R_a's remainder) + 100 ms service = 200 ms > 150 ms whatever
// the class does. At +10 ms R_b is abandoned and W_c starts: a2, had it been
// queued behind W_c, would still have waited for R_a until +100 ms and ended
// at +200 ms. Yet FalseRejects becomes 1.
func TestRegression9TenantBoundRejectCountedFalse(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "main", Slots: 2, QueueItems: 4, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDefaultClass("main"),
		admission.WithStages(admission.AllStages&^admission.StageDegradation))
	req := func(tenant string) admission.Request {
		r := work("/demo.Main/Do")
		r.Tenant = tenant
		return r
	}
	pa := h.admitted(req("a"))
	defer pa.Abandon()
	pb := h.admitted(req("b"))
	wc := h.queued(req("c"))
	a2 := req("a")
	a2.Deadline = h.clk.Now().Add(150 * time.Millisecond)
	h.refused(a2, status.ReasonDeadlineUnreachable) // right: a's own work alone puts its end at +200 ms
	h.clk.Advance(10 * time.Millisecond)
	pb.Abandon() // teaches nothing: the mean stays 100 ms
	h.drain()
	r := h.take(wc)
	if r.err != nil {
		t.Fatalf("W_c: %v", r.err)
	}
	defer r.permit.Abandon()
	st, _ := h.ctrl.Stats().Class("main")
	if st.FalseRejects != 0 {
		t.Fatalf("FalseRejects = %d: a2 could not start before R_a ended (+100 ms) and needed 100 ms with 150 ms to spare, yet W_c's start at +10 ms judged its refusal avoidable", st.FalseRejects)
	}
}

package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Class main: 2 slots, TenantRunning 1, 100 ms of service. x's request X
// started at 0 and is nearly done (10 ms left); tenant a's request R started
// at 90 ms (100 ms left). The class is full, so a's next request Q is not
// "held back only by its tenant" and decideLocked judges it by the class's
// predicted wait alone: (10 + 100) / 2 = 55 ms, 55 + 100 <= 180 ms, queued.
// But Q cannot start before R ends — its tenant is at its running limit, and
// pump skips it until then — so it starts at +100 ms at best and finishes at
// +200 ms, past its +180 ms deadline: it was queued although it could never
// finish, and is dropped later. The tenant's own start wait bounds Q's wait
// whether or not the class also is full; Q should be refused
// DEADLINE_UNREACHABLE on arrival (as the held-back-only case is since
// TestTenantHeldBackIsJudgedByItsTenantsWait).
func TestRegression5TenantAtLimitInAFullClassIsJudgedByItsTenantsWait(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "main", Slots: 2, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}))
	req := func(tn string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tn; return r }
	px := h.admitted(req("x"))
	h.clk.Advance(90 * time.Millisecond)
	pr := h.admitted(req("a"))
	q := req("a")
	q.Deadline = h.clk.Now().Add(180 * time.Millisecond)
	id, e := h.arrive(q)
	if e.Kind == admission.EventRefused {
		if got := status.OutcomeOf(h.take(id).err).Reason; got != status.ReasonDeadlineUnreachable {
			t.Fatalf("Q refused %s, want DEADLINE_UNREACHABLE", status.ReasonName(got))
		}
		px.Abandon()
		pr.Abandon()
		h.drain()
		return
	}
	// Show what becomes of it: X ends on time, R ends on time, Q is dropped.
	h.clk.Advance(10 * time.Millisecond)
	h.release(px)
	h.clk.Advance(90 * time.Millisecond)
	h.release(pr)
	res := h.take(id)
	if res.permit != nil {
		res.permit.Abandon()
		h.drain()
	}
	t.Errorf("Q (deadline +180 ms) was %v on arrival although it cannot start before a's R ends at +100 ms "+
		"nor finish before +200 ms; at R's end it got %v", e.Kind, res.err)
}

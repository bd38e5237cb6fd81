package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
)

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
func TestRegression8PumpSinglePassLeavesBorrowerQueued(t *testing.T) {
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

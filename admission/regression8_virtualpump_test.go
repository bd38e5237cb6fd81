package admission_test

import (
	"testing"

	"github.com/tollgate-go/tollgate/admission"
)

// On a virtual clock a waiter whose context ends leaves without a pump:
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
func TestRegression8VirtualClockNextAdmitOvertakesWaiter(t *testing.T) {
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

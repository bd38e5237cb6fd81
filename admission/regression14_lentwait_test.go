package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Lender L (1 slot, LendIdle, 100 ms) has lent its only slot to class X,
// whose requests take 1 s. L's own request then finds no slot: it cannot
// start before X's borrower ends (~1 s), so with 150 ms to its deadline it
// cannot finish and must be refused DEADLINE_UNREACHABLE on arrival.
// predictedWaitLocked counts only L's own running requests (none) and L's
// queue (empty): a full class predicts a wait of 0, and the request is
// queued, to be dropped DEADLINE_EXPIRED (final) later.
func TestRegression14LenderFullyLentPredictsNoWait(t *testing.T) {
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

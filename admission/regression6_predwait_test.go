package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

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
func TestRegression6FullClassPredictsNoWaitWithALentSlot(t *testing.T) {
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

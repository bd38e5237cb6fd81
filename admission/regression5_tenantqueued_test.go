package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Class main (1 slot, TenantQueued 1) is busy with x's request. Tenant a's
// waiter W1 (deadline +300 ms) can no longer finish once 250 ms have passed
// (250 + 100 ms of service > 300). A new request W2 of a, with a whole second
// to spare, is refused TENANT_LIMIT: the tenant-limit stage counts W1, which
// can only be dropped, and the expired-waiter sweep runs only when the
// CLASS's queue is full. The package doc promises that work which can no
// longer finish is dropped "when a new request finds the queue full, so it
// never holds a place useful work could take"; here it holds the tenant's
// only place, and the tenant is told it is over a limit it is not over.
func TestRegression5ExpiredWaiterDoesNotHoldTheTenantsQueuePlace(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "main", Slots: 1, QueueItems: 10, TenantQueued: 1, ExpectedServiceTime: 100 * time.Millisecond}))
	x := work("/demo.Main/Do")
	x.Tenant = "x"
	px := h.admitted(x)
	w1 := work("/demo.Main/Do")
	w1.Tenant = "a"
	w1.Deadline = h.clk.Now().Add(300 * time.Millisecond)
	id1 := h.queued(w1)
	h.clk.Advance(250 * time.Millisecond) // W1 cannot finish any more: 250+100 > 300
	w2 := work("/demo.Main/Do")
	w2.Tenant = "a"
	w2.Deadline = h.clk.Now().Add(time.Second)
	id2, e := h.arrive(w2)
	if e.Kind == admission.EventRefused {
		err := h.take(id2).err
		t.Fatalf("W2 (1 s to spare) refused %s while a's only queued request W1 can no longer finish (it holds the place)",
			status.ReasonName(status.OutcomeOf(err).Reason))
	}
	// Correct behaviour: W1 dropped DEADLINE_EXPIRED, W2 queued; it starts
	// when x ends.
	if r := h.take(id1); status.OutcomeOf(r.err).Reason != status.ReasonDeadlineExpired {
		t.Fatalf("W1: %v", r.err)
	}
	evs := h.release(px)
	started := false
	for _, e := range evs {
		started = started || e.Kind == admission.EventStarted
	}
	if !started {
		t.Fatalf("W2 did not start when x ended: %v", evs)
	}
	h.take(id2).permit.Abandon()
	h.drain()
}

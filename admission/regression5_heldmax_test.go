package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Class main: 4 slots, TenantRunning 1, 100 ms of service. Tenant a's R
// started at 0; y's and z's requests at 90 ms. At 90 ms a's next request Q
// (deadline +130 ms) is held back only by a's running limit: one slot is
// idle. Q starts the moment R ends (+10 ms): R's slot frees and the waiters
// ahead of Q, if any, are all held by their own tenants. So Q finishes at
// +110 ms, in time. decideLocked takes max(class wait, tenant wait): the
// class's predicted wait spreads y's and z's fresh work over the slots,
// (10 + 100 + 100) / 4 = 52.5 ms, and 52.5 + 100 > 130 refuses Q
// DEADLINE_UNREACHABLE: a false reject. The class wait is the wait for ANY
// slot of a full class; Q needs none but the one its tenant frees.
func TestRegression5HeldBackRequestIsNotJudgedByTheClassWait(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}))
	req := func(tn string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tn; return r }
	pr := h.admitted(req("a"))
	h.clk.Advance(90 * time.Millisecond)
	py := h.admitted(req("y"))
	pz := h.admitted(req("z"))
	defer py.Abandon()
	defer pz.Abandon()
	q := req("a")
	q.Deadline = h.clk.Now().Add(130 * time.Millisecond)
	id, e := h.arrive(q)
	if e.Kind == admission.EventRefused {
		t.Fatalf("Q refused %s although it starts when R ends (+10 ms) and finishes at +110 ms of 130",
			status.ReasonName(status.OutcomeOf(h.take(id).err).Reason))
	}
	h.clk.Advance(10 * time.Millisecond)
	h.release(pr)
	r := h.take(id)
	if r.err != nil {
		t.Fatalf("Q: %v", r.err)
	}
	r.permit.Abandon()
	h.drain()
}

package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Class main: 4 slots, a queue, TenantRunning 1, 100 ms of service. Tenant a
// runs R; 3 of 4 slots are idle. a then sends requests whose deadline (50
// ms) cannot fit even the service time: each is held back only by a's own
// running limit and refused DEADLINE_UNREACHABLE. Before 74d2b99 such a
// refusal was callerOnly (heldByTenant); now callerOnly is
// "wait == 0 || classWait+svc+margin fits", and classWait is 0 for a
// held-back request, so a deadline shorter than the service time makes the
// refusal count as overload. The same request from a tenant that may run
// (wait 0) is callerOnly; the README says the refusal of a request held back
// only by its own tenant's running limit while its class had a slot free
// does not count. One tenant's too-short deadlines degrade the server.
func TestRegression6HeldShortDeadlineIsNotOverload(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "opt", Slots: 4, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 1}))
	a := work("/demo.Main/Do")
	a.Tenant = "a"
	pa := h.admitted(a)
	defer pa.Abandon()
	for range 40 {
		r := a
		r.Deadline = h.clk.Now().Add(50 * time.Millisecond)
		h.refused(r, status.ReasonDeadlineUnreachable)
	}
	// The class is not overloaded: another tenant starts at once.
	b := work("/demo.Main/Do")
	b.Tenant = "b"
	h.admitted(b).Abandon()
	h.drain()
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Errorf("tenant a's own too-short deadlines, held back only by a's running limit (3 of 4 slots idle), degraded the server: mode %v", m)
	}
}

package admission_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// TenantQueueWork is checked as tc.work + work > TenantQueueWork, so once
// the class's learned mean exceeds the bound (here from the start; under
// overload service times grow and the learned mean gets there by itself) a
// tenant with nothing queued and nothing running is refused TENANT_LIMIT
// for its one request whenever the class is full. Since 74d2b99
// TENANT_LIMIT counts in no window ("so that a tenant flooding past its own
// limits cannot dilute the refusals that show real overload"): here no
// tenant floods — ten tenants send one request each to a 1-slot class — yet
// every refusal is TENANT_LIMIT, the window sees one healthy start and no
// refusal, and the server stays Normal while refusing 10 of 11 requests for
// lack of capacity. Without TenantQueueWork the same load is QUEUE_FULL
// and degrades.
func TestRegression8SingleRequestOverQueueWorkHidesOverload(t *testing.T) {
	for _, qw := range []time.Duration{0, 50 * time.Millisecond} {
		t.Run(fmt.Sprintf("TenantQueueWork=%v", qw), func(t *testing.T) {
			reasons, m := oneRequestPerTenant(t, qw, false)
			if m != admission.ModeDegraded {
				t.Fatalf("1 slot, 11 requests from 11 tenants (one each): %v; mode %v, want DEGRADED", reasons, m)
			}
		})
	}
}

// oneRequestPerTenant runs one healthy request in a 1-slot class (queue 2,
// TenantQueueWork qw, 100 ms of service) and sends ten more, one per
// tenant, without a deadline or (expired) with one already passed, then
// closes the window. It returns their outcomes (a refusal's reason, or
// "queued") and the mode.
func oneRequestPerTenant(t *testing.T, qw time.Duration, expired bool) (map[string]int, admission.Mode) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "main", Slots: 1, QueueItems: 2, TenantQueueWork: qw, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDefaultClass("main"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 5, EnterAfter: 1}))
	p := h.admitted(work("/demo.Main/Do"))
	defer p.Abandon()
	reasons := map[string]int{}
	for i := range 10 {
		r := work("/demo.Main/Do")
		r.Tenant = fmt.Sprintf("t%d", i) // one request per tenant: nothing queued, nothing running
		if expired {
			r.Deadline = h.clk.Now().Add(-time.Millisecond)
		}
		id, e := h.arrive(r)
		if e.Kind == admission.EventRefused {
			reasons[status.ReasonName(status.OutcomeOf(h.take(id).err).Reason)]++
		} else {
			reasons["queued"]++
		}
	}
	h.tick(time.Second)
	return reasons, h.ctrl.Mode()
}

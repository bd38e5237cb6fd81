package admission_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Class main (1 slot, 5 queued, TenantQueued 1) is overloaded: its slot is
// busy, its queue full, and 20 requests of 20 tenants are refused
// QUEUE_FULL in one window — the server degrades. Add one noisy tenant n,
// whose one request waits and whose 100 further requests are refused
// TENANT_LIMIT (over its own TenantQueued): TENANT_LIMIT goes through
// countRefusal, so each counts as a healthy decision in the window, the
// refusal ratio falls to 20/126 and the server stays Normal — the real
// overload of every other tenant is hidden by one tenant's own limit.
// A tenant's limit is "not the server's overload" (README); it is not the
// server's health either: like the caller-only refusals (deadline passed
// on arrival) and the tenant-held drops, it should count in no window.
func TestRegression5TenantLimitRefusalsDoNotHideOverload(t *testing.T) {
	for _, noisy := range []bool{false, true} {
		t.Run(fmt.Sprintf("noisy=%v", noisy), func(t *testing.T) {
			h := newHarness(t,
				admission.WithClasses(
					admission.Class{Name: "main", Slots: 1, QueueItems: 5, TenantQueued: 1, ExpectedServiceTime: 100 * time.Millisecond},
					admission.Class{Name: "opt", Slots: 4, Optional: true}),
				admission.WithMethods("opt", "/demo.Opt/"),
				admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 1}))
			req := func(tn string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tn; return r }
			px := h.admitted(req("x"))
			defer px.Abandon()
			h.queued(req("n"))
			for i := range 4 {
				h.queued(req(fmt.Sprintf("y%d", i)))
			}
			for i := range 20 {
				h.refused(req(fmt.Sprintf("z%d", i)), status.ReasonQueueFull)
			}
			if noisy {
				for range 100 {
					h.refused(req("n"), status.ReasonTenantLimit)
				}
			}
			h.tick(time.Second)
			if m := h.ctrl.Mode(); m != admission.ModeDegraded {
				t.Errorf("20 of 20 other tenants' requests refused QUEUE_FULL in a full class, yet mode %v (noisy tenant: %v)", m, noisy)
			}
		})
	}
}

package admission_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// The controller degrades because class main refuses QUEUE_FULL to 20 of
// 20 requests in a window. In the next window main is just as overloaded
// (20 of 20 refused QUEUE_FULL again), but the optional class's callers keep
// arriving and are refused SHED — by the degraded mode itself. refusedN
// counts every SHED refusal as a healthy decision, so 100 shed requests
// dilute main's refusal ratio to 20/120 and the window reads healthy: the
// controller moves to Recovering and re-admits the optional class while
// the main class is still fully overloaded. The shedding that degradation
// does is neither load nor health (like TENANT_LIMIT, see
// TestRegression5TenantLimitRefusalsDoNotHideOverload); seed 002: "a
// falling error rate caused by rejecting nearly everything is not
// recovery". With opt quiet the same window stays Degraded.
func TestRegression13ShedRefusalsDoNotHideOverload(t *testing.T) {
	for _, optTraffic := range []bool{false, true} {
		t.Run(fmt.Sprintf("optTraffic=%v", optTraffic), func(t *testing.T) {
			h := newHarness(t,
				admission.WithClasses(
					admission.Class{Name: "main", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond},
					admission.Class{Name: "opt", Slots: 4, QueueItems: 4, Optional: true}),
				admission.WithMethods("opt", "/demo.Opt/"),
				admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 1, ExitAfter: 3}))
			p := h.admitted(work("/demo.Main/Do"))
			defer p.Abandon()
			h.queued(work("/demo.Main/Do"))
			for range 20 {
				h.refused(work("/demo.Main/Do"), status.ReasonQueueFull)
			}
			h.tick(time.Second)
			if m := h.ctrl.Mode(); m != admission.ModeDegraded {
				t.Fatalf("setup: mode %v, want DEGRADED", m)
			}
			// Window 2: main exactly as overloaded as in window 1.
			for range 20 {
				h.refused(work("/demo.Main/Do"), status.ReasonQueueFull)
			}
			if optTraffic {
				for range 100 {
					h.refused(work("/demo.Opt/Do"), status.ReasonShed)
				}
			}
			h.tick(time.Second)
			if m := h.ctrl.Mode(); m != admission.ModeDegraded {
				t.Errorf("main refused 20 of 20 QUEUE_FULL again, yet mode %v (optional traffic shed: %v)", m, optTraffic)
			}
		})
	}
}

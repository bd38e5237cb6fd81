package admission_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Requests that arrive with their deadline already passed are "the caller's
// problem and count in no window" (doc.go, README): without TenantQueueWork
// they are refused DEADLINE_EXPIRED and counted in no window. The tenant
// stage runs before the deadline stage, and since 7f5cab0 a TENANT_LIMIT for
// TenantQueueWork of a tenant with nothing waiting in a full class (classFull)
// counts in the window as QUEUE_FULL. So with TenantQueueWork below the
// learned mean, the same already-expired arrivals are refused TENANT_LIMIT
// and counted as overload, and they alone degrade the server. (The
// TenantRunning/no-queue refusal beside it explicitly yields to an
// already-passed deadline; this one does not.)
func TestRegression9ExpiredArrivalsCountAsClassFull(t *testing.T) {
	for _, qw := range []time.Duration{0, 50 * time.Millisecond} {
		t.Run(fmt.Sprintf("TenantQueueWork=%v", qw), func(t *testing.T) {
			h := newHarness(t, admission.WithClasses(
				admission.Class{Name: "main", Slots: 1, QueueItems: 2, TenantQueueWork: qw, ExpectedServiceTime: 100 * time.Millisecond}),
				admission.WithDefaultClass("main"),
				admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 5, EnterAfter: 1}))
			p := h.admitted(work("/demo.Main/Do"))
			defer p.Abandon()
			reasons := map[string]int{}
			for i := range 10 {
				r := work("/demo.Main/Do")
				r.Tenant = fmt.Sprintf("t%d", i)
				r.Deadline = h.clk.Now().Add(-time.Millisecond) // already expired on arrival
				id, e := h.arrive(r)
				if e.Kind != admission.EventRefused {
					t.Fatalf("an expired request was %v", e.Kind)
				}
				reasons[status.ReasonName(status.OutcomeOf(h.take(id).err).Reason)]++
			}
			h.tick(time.Second)
			if m := h.ctrl.Mode(); m != admission.ModeNormal {
				t.Fatalf("10 requests expired on arrival (%v) beside one healthy start: mode %v, want NORMAL (expired arrivals count in no window)", reasons, m)
			}
		})
	}
}

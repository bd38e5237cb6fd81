package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Class main has 4 slots, a queue of 2 and TenantRunning 1. Tenant a runs
// one request and has two more waiting for it: they fill main's queue
// although 3 of 4 slots are idle, so every further request of a finds the
// queue full. Those requests are held back only by their own tenant's
// running limit (the class has slots free: other tenants are admitted at
// once), yet decideLocked refuses them QUEUE_FULL through countRefusal, an
// overload refusal for the degradation window: one tenant pushing past its
// own limit degrades the server and sheds every tenant's optional work.
// The package doc says such refusals "are the tenant's doing: they do not
// count as overload for degradation".
func TestRegression5TenantHeldBackQueueFullIsNotOverload(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 4, QueueItems: 2, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "opt", Slots: 4, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 1}))
	a := work("/demo.Main/Do")
	a.Tenant = "a"
	pa := h.admitted(a)
	defer pa.Abandon()
	h.queued(a) // held back by a's own limit (3 slots idle)
	h.queued(a) // the queue (2 places) is now full of a's own work
	reasons := map[string]int{}
	for range 40 {
		id, e := h.arrive(a)
		if e.Kind != admission.EventRefused {
			t.Fatalf("request %d of a: %v, want a refusal", id, e.Kind)
		}
		reasons[status.ReasonName(status.OutcomeOf(h.take(id).err).Reason)]++
	}
	t.Logf("tenant a's requests over its own limit, 3 of 4 slots idle: %v", reasons)
	// Another tenant still gets a slot at once: the class is not overloaded.
	b := work("/demo.Main/Do")
	b.Tenant = "b"
	h.admitted(b).Abandon()
	h.drain()
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Errorf("tenant a over its own running limit (3 of 4 slots idle) degraded the server: mode %v, refusals %v", m, reasons)
	}
}

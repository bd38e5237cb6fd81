package admission_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A review found that the previous fix moved Recovering's "stepped" exemption from decideLocked's refuse
// switch (case callerOnly, c.stepped(cs)) into countRefusal; but the
// classFull branch of that switch calls c.deg.refused directly, so a
// TENANT_LIMIT refusal that the class's lack of room caused (TenantQueueWork
// below one request's learned work, in a class with no slot) counts as
// overload again while the class is stepped — the lowered slots are the
// step's, not load. 0e0b954 exempted it; e33c801 regressed it. Here an
// optional load of 3 tenants' single requests, within the class's 3
// configured slots, throws the controller from Recovering back to Degraded.
func TestRegression14cSteppedClassFullTenantLimitCountsAsOverload(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, QueueItems: 3, Optional: true,
				ExpectedServiceTime: time.Second, TenantQueueWork: 100 * time.Millisecond},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
		}))
	// Window 1: main overloaded → Degraded; window 2 healthy → Recovering.
	p := h.admitted(work(mainM))
	h.refused(work(mainM), status.ReasonConcurrencyFull)
	h.release(p)
	h.tick(time.Second)
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeRecovering {
		t.Fatalf("mode %v, want RECOVERING", m)
	}
	st, _ := h.ctrl.Stats().Class("opt")
	if st.Slots != 1 {
		t.Fatalf("opt slots %d, want the first step's 1", st.Slots)
	}
	// Three tenants, one request each: the first runs on the stepped slot;
	// the others find the stepped class full and are refused TENANT_LIMIT
	// (their one request's learned work exceeds TenantQueueWork) — the
	// step's doing.
	opt := func(tenant string) admission.Request {
		r := work(optM)
		r.Tenant = tenant
		r.Deadline = h.clk.Now().Add(time.Minute)
		return r
	}
	a := h.admitted(opt("t0"))
	defer a.Abandon()
	for i := 1; i < 3; i++ {
		h.refused(opt(fmt.Sprintf("t%d", i)), status.ReasonTenantLimit)
	}
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeRecovering {
		t.Fatalf("after a window whose only refusals the step caused: mode %v, want RECOVERING", m)
	}
}

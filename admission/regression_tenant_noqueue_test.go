package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A class without a queue (QueueItems 0) and a per-tenant running limit
// refused a request held back only by its tenant's limit with
// CONCURRENCY_FULL while the class had free slots, and counted it as an
// overload refusal in the degradation window: one tenant hammering past its
// own limit degraded the whole server and shed other tenants' optional work
// (DESIGN §3.11, tenants stay apart; found by review). It is TENANT_LIMIT.
func TestTenantOverLimitWithoutQueueIsTenantLimit(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 8, TenantRunning: 1},
			admission.Class{Name: "opt", Slots: 4, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20}))
	r := work("/demo.Main/Do")
	r.Tenant = "noisy"
	p, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	_, err = c.Admit(context.Background(), r)
	if got := status.OutcomeOf(err).Reason; got != status.ReasonTenantLimit {
		t.Errorf("second request of a tenant at its running limit, 7 of 8 slots free: %v, want TENANT_LIMIT", got)
	}
	for range 30 {
		_, _ = c.Admit(context.Background(), r)
	}
	clk.Advance(time.Second)
	if m := c.Mode(); m != admission.ModeNormal {
		t.Errorf("one tenant over its own limit moved the server to %v (7 of 8 slots idle)", m)
	}
	q := work("/demo.Opt/Do")
	q.Tenant = "quiet"
	if _, err := c.Admit(context.Background(), q); err != nil {
		t.Errorf("another tenant's optional request: %v", err)
	}
}

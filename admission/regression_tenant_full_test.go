package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// In a queueless class, a request whose tenant is at its running limit was
// refused TENANT_LIMIT even when the class itself had no free slot (a first
// fix of TestTenantOverLimitWithoutQueueIsTenantLimit; found by review).
// TENANT_LIMIT is not an overload refusal for the degradation window, so a
// class that was full and refusing every request (here every tenant at its
// limit: TenantRunning × tenants = Slots) never degraded the server. A full
// class is CONCURRENCY_FULL, whatever the tenant.
func TestFullQueuelessClassCountsAsOverload(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 2, TenantRunning: 1},
			admission.Class{Name: "opt", Slots: 4, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 1}))
	for _, tenant := range []string{"a", "b"} {
		r := work("/demo.Main/Do")
		r.Tenant = tenant
		p, err := c.Admit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release()
	}
	var reasons = map[string]int{}
	for i := range 40 {
		r := work("/demo.Main/Do")
		r.Tenant = []string{"a", "b"}[i%2]
		_, err := c.Admit(context.Background(), r)
		reasons[status.ReasonName(status.OutcomeOf(err).Reason)]++
	}
	t.Logf("refusals with the class full (2 of 2 slots busy): %v", reasons)
	for range 3 {
		clk.Advance(time.Second)
		_ = c.Mode()
	}
	if m := c.Mode(); m == admission.ModeNormal {
		t.Errorf("class full, 40 of 40 requests refused, yet mode %v: the overload is booked as TENANT_LIMIT", m)
	}
}

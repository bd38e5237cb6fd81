package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// In a queueless class with free slots, a request held back only by its
// tenant's running limit was refused DEADLINE_UNREACHABLE (an overload
// reason for degradation) when its deadline was short of the class's
// "predicted wait" — a wait that cannot happen (no queue): one tenant over
// its own limit degraded the server and shed other tenants' optional work
// (found by review). It is TENANT_LIMIT, decided before the deadline stage.
func TestTenantOverLimitWithATightDeadlineIsNotOverload(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 4, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "opt", Slots: 4, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 1}))
	r := work("/demo.Main/Do")
	r.Tenant = "a"
	p, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	// Another tenant, same deadline: admitted (the class has 3 free slots).
	rb := work("/demo.Main/Do")
	rb.Tenant = "b"
	rb.Deadline = clk.Now().Add(112 * time.Millisecond)
	pb, err := c.Admit(context.Background(), rb)
	if err != nil {
		t.Fatalf("tenant b with the same deadline: %v", err)
	}
	pb.Release()
	reasons := map[string]int{}
	for range 40 {
		r := work("/demo.Main/Do")
		r.Tenant = "a"
		r.Deadline = clk.Now().Add(112 * time.Millisecond)
		_, err := c.Admit(context.Background(), r)
		reasons[status.ReasonName(status.OutcomeOf(err).Reason)]++
	}
	t.Logf("tenant a over its limit, class 1 of 4 busy: %v", reasons)
	if reasons["TENANT_LIMIT"] != 40 {
		t.Errorf("want TENANT_LIMIT for every refusal, got %v", reasons)
	}
	for range 3 {
		clk.Advance(time.Second)
		_ = c.Mode()
	}
	if m := c.Mode(); m != admission.ModeNormal {
		t.Errorf("one tenant over its own limit degraded the server: mode %v", m)
	}
}

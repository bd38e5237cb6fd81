package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// In a class with a queue and free slots, a request held back only by its
// tenant's running limit was judged against the class's predicted wait and,
// with a tight deadline, refused DEADLINE_UNREACHABLE counted as overload:
// one tenant over its own limit degraded the server and shed other tenants'
// optional work (found by review). Such a refusal says nothing about load
// and is not counted as overload.
func TestTenantOverLimitInAQueuedClassDoesNotDegrade(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond},
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
	for range 40 {
		r := work("/demo.Main/Do")
		r.Tenant = "a"
		r.Deadline = clk.Now().Add(112 * time.Millisecond)
		// Should one queue instead, it gives up soon: only the decision matters.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := c.Admit(ctx, r)
		cancel()
		if o := status.OutcomeOf(err); o.Kind != status.KindNotAdmitted || o.Reason != status.ReasonDeadlineUnreachable {
			t.Fatalf("tenant a over its limit with a deadline it cannot meet behind its own work: %v", err)
		}
	}
	for range 3 {
		clk.Advance(time.Second)
		_ = c.Mode()
	}
	if m := c.Mode(); m != admission.ModeNormal {
		t.Errorf("one tenant over its own limit, 3 of 4 slots idle, degraded the server: mode %v", m)
	}
}

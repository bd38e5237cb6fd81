package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Class main: 16 slots, no queue, TenantRunning 2, 100 ms of service.
// Tenant a runs R1 (started at 0, 10 ms left at 90 ms) and R2 (started at
// 90 ms, 100 ms left). a's next request at 90 ms is refused TENANT_LIMIT;
// a may run again as soon as R1 ends, 10 ms later. tenantWaitLocked, which
// sets the retry-after, spreads the SUM of a's remainders over its limit,
// (10 + 100) / 2 = 55 ms, so the jittered retry-after lies in
// [27.5, 82.5) ms: always several times the real 10 ms (jittered: [5, 15)).
// This is the sum-over-the-limit estimate that was replaced in
// tenantStartWaitLocked (TestTenantWaitIsTheSoonestEndWithALimitOf2), still
// in use for the refusal's retry-after.
func TestRegression5TenantLimitRetryAfterIsTheTenantsNextSlot(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(
		admission.Class{Name: "main", Slots: 16, TenantRunning: 2, ExpectedServiceTime: 100 * time.Millisecond}))
	r := work("/demo.Main/Do")
	r.Tenant = "a"
	p1, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Abandon()
	clk.Advance(90 * time.Millisecond)
	p2, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Abandon()
	var worst time.Duration
	for range 20 {
		_, err := c.Admit(context.Background(), r)
		o := status.OutcomeOf(err)
		if o.Reason != status.ReasonTenantLimit {
			t.Fatalf("got %v, want TENANT_LIMIT", err)
		}
		ra, _ := status.RetryAfter(err)
		worst = max(worst, ra)
		if ra >= 20*time.Millisecond {
			t.Fatalf("retry-after %v for a tenant that may run again in 10 ms (R1's remainder)", ra)
		}
	}
	t.Logf("largest retry-after %v", worst)
}

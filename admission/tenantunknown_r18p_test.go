package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A TENANT_LIMIT refusal in a class with nothing learned suggested the
// ~10 ms floor however long the tenant's running request had run: its
// retry-after took the tenant's first slot to free from the learned mean,
// 0 there. As for the class's own wait (PredictedWait), a running request
// is expected to run as long again as it has.
func TestR18pTenantLimitRetryAfterWithNothingLearnedFollowsTheRunningWork(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "a", Slots: 4, TenantRunning: 1}),
		admission.WithDefaultClass("a"))
	r := work(unknownM)
	r.Tenant = "t1"
	p := h.admitted(r)
	h.tick(2 * time.Second) // it has run 2 s
	for range 20 {
		err := h.refused(r, status.ReasonTenantLimit)
		ra, ok := status.RetryAfter(err)
		require.True(t, ok)
		require.GreaterOrEqual(t, ra, time.Second, "retry-after %v, jittered from the 2 s the tenant's request is expected to run yet", ra)
		require.Less(t, ra, 3*time.Second)
	}
	h.release(p)
}

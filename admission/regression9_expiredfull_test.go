package admission_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
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
			reasons, m := oneRequestPerTenant(t, qw, true)
			if reasons["queued"] > 0 {
				t.Fatalf("an expired request was queued: %v", reasons)
			}
			if m != admission.ModeNormal {
				t.Fatalf("10 requests expired on arrival (%v) beside one healthy start: mode %v, want NORMAL (expired arrivals count in no window)", reasons, m)
			}
		})
	}
}

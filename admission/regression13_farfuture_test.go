package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
)

// AdmitAt with a time more than ~292 years after the controller's epoch
// (a bogus virtual time, a zero-based simulation clock fed real times):
// rollWindows' skip computes (now.Sub(winEnd)/w + 1) * w; now.Sub
// saturates at the maximum Duration, the product overflows to a negative
// Duration, winEnd moves backwards, and the loop never ends — spinning
// under the controller's lock, so every later Admit, Release, tap refresh
// and metric scrape blocks forever. Expected: the call returns (the
// windows are skipped, or the time refused). The failure is a hang, not
// slowness: the bound below is generous.
func TestRegression13FarFutureTimeDoesNotWedge(t *testing.T) {
	ctrl, err := admission.New()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p, err := ctrl.AdmitAt(context.Background(), work("/demo.Main/Do"), time.Now().AddDate(300, 0, 0))
		if err == nil {
			p.Abandon()
		}
	}()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case <-done:
		ctrl.Close()
	case <-timer.C:
		t.Fatal("AdmitAt 300 years ahead never returned: rollWindows loops forever under the lock")
	}
}

package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
)

// After a fall-back from Recovering (hold set), an hour without traffic is an
// hour of healthy windows: the controller must be Normal, whatever ExitAfter.
func TestRegressionIdleHourAfterHoldIsNormal(t *testing.T) {
	for _, exit := range []int{3, 8, 10, 20} {
		h := degradeHarness(t, 1, exit)
		h.window(true)                                        // O: Degraded
		h.window(false)                                       // H: Recovering
		if m := h.window(true); m != admission.ModeDegraded { // O: re-entry, hold
			t.Fatalf("exit %d: mode %v after re-entry", exit, m)
		}
		h.tick(time.Hour)
		if m := h.ctrl.Mode(); m != admission.ModeNormal {
			st, _ := h.ctrl.Stats().Class("opt")
			t.Errorf("exit %d: after an idle hour the mode is %v (optional class slots %d of 3)", exit, m, st.Slots)
		}
	}
}

package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// An optional class (3 slots, no queue) carries a steady load of three
// concurrent requests, which its configured slots serve without a single
// refusal. One overloaded window of the main class degrades the controller;
// the optional class is shed, then re-admitted in steps while Recovering
// (1 slot after one healthy window). The refusals that the controller's own
// step makes (CONCURRENCY_FULL for the 2nd and 3rd of each round) are
// counted as overload, so every Recovering window is overloaded and sends
// the controller back to Degraded: it never returns to Normal although the
// main class is idle and the optional load fits the configuration.
func TestRegression14SteppedReadmissionRefusalsNeverLetItRecover(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, Optional: true},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
		}))
	// Sanity: at full capacity the optional load is never refused.
	optRound := func() (admitted, refused int) {
		var ps []*admission.Permit
		for range 3 {
			id, e := h.arrive(work(optM))
			r := h.take(id)
			if e.Kind == admission.EventAdmitted {
				ps = append(ps, r.permit)
				admitted++
			} else {
				refused++
			}
		}
		for _, p := range ps {
			h.release(p)
		}
		return admitted, refused
	}
	if a, r := optRound(); a != 3 || r != 0 {
		t.Fatalf("Normal: optional round admitted %d refused %d", a, r)
	}
	h.tick(time.Second)
	// One overloaded window of main: Degraded.
	p := h.admitted(work(mainM))
	h.refused(work(mainM), status.ReasonConcurrencyFull)
	h.release(p)
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeDegraded {
		t.Fatalf("mode %v, want DEGRADED", m)
	}
	var modes []admission.Mode
	normal := false
	for range 40 {
		for range 5 {
			optRound()
		}
		h.tick(time.Second)
		m := h.ctrl.Mode()
		modes = append(modes, m)
		if m == admission.ModeNormal {
			normal = true
			break
		}
	}
	if !normal {
		t.Fatalf("40 windows with main idle and an optional load that fits its 3 configured slots: never NORMAL again; modes %v", modes)
	}
}

package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

// A review found that the first fix decided whether the tap's refusals are "stepped" (no overload)
// when they are folded into the window, at its end, not when the tap made
// them. An operator forces RECOVERING for 500 ms: the optional class is held
// to 1 of its 3 slots, and its refusals are the controller's own step. The
// same refusals made by Admit in that period count in no window; made by the
// tap, they are folded after the forced mode expired (advance expires
// overrides before it rolls windows), counted as overload, and the
// controller degrades, shedding the optional class, for a window whose only
// refusals were the step's.
func TestRegression14bTapSteppedRefusalsJudgedAtFoldTime(t *testing.T) {
	for _, byTap := range []bool{false, true} {
		name := "admit"
		if byTap {
			name = "tap"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t,
				admission.WithClasses(
					admission.Class{Name: "main", Slots: 1},
					admission.Class{Name: "opt", Slots: 3, Optional: true},
				),
				admission.WithMethods("opt", optM),
				admission.WithDegradation(admission.Degradation{
					Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
				}))
			if _, err := h.ctrl.SetOverride(context.Background(), admission.Override{
				Actor: "op", Reason: "test", TTL: 500 * time.Millisecond, Mode: admission.ModeRecovering,
			}); err != nil {
				t.Fatal(err)
			}
			h.drain()
			p := h.admitted(work(optM)) // the step's one slot
			for range 10 {
				if byTap {
					if _, err := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: optM}); status.OutcomeOf(err).Reason != status.ReasonConcurrencyFull {
						t.Fatalf("tap: %v", err)
					}
				} else {
					h.refused(work(optM), status.ReasonConcurrencyFull)
				}
			}
			h.release(p)
			h.tick(time.Second)
			if m := h.ctrl.Mode(); m != admission.ModeNormal {
				t.Fatalf("refused only by the forced RECOVERING step (by %s), yet the window was counted overloaded: mode %v", name, m)
			}
		})
	}
}

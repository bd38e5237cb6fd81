package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A service owner found that, with the README's own example (heavy: 6 slots;
// batch: 4 slots, Optional and LendIdle) and no batch traffic, heavy ran 10
// at once while Normal but only 6 while Degraded: a shed optional class
// lends nothing, and Recovering's step bounds its lending as it bounds its
// own requests. That is the design, now stated in the README; these pin it,
// and the README's advice: a lender that is not Optional keeps lending
// while Degraded.

const r18HeavyM = "/demo.Heavy/Do"

// heavyRuns admits heavy requests until one is refused CONCURRENCY_FULL and
// returns how many ran, releasing them.
func (h *harness) heavyRuns() int {
	h.t.Helper()
	var ps []*admission.Permit
	for {
		id, e := h.arrive(work(r18HeavyM))
		res := h.take(id)
		if e.Kind == admission.EventRefused {
			require.Equal(h.t, status.ReasonConcurrencyFull, status.OutcomeOf(res.err).Reason, "%v", res.err)
			break
		}
		require.NoError(h.t, res.err)
		ps = append(ps, res.permit)
	}
	for _, p := range ps {
		h.release(p)
	}
	return len(ps)
}

func TestR18aShedLenderLendsNothingWhileDegraded(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		lenders                     []admission.Class
		normal, recovering, degrade int
	}{
		// The README's example: batch lends only what its mode lets it use.
		{"optional lender", []admission.Class{{Name: "batch", Slots: 4, Optional: true, LendIdle: true}}, 10, 6 + 2, 6},
		// The README's advice: a lender that is not Optional keeps lending.
		{"lender not optional", []admission.Class{{Name: "batch", Slots: 4, LendIdle: true}}, 10, 10, 10},
		// Or split it: the part that is not optional keeps lending.
		{"split lender", []admission.Class{{Name: "batch", Slots: 2, Optional: true, LendIdle: true}, {Name: "spare", Slots: 2, LendIdle: true}},
			10, 6 + 2 + 1, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t,
				admission.WithClasses(append([]admission.Class{{Name: "heavy", Slots: 6, ExpectedServiceTime: time.Second}}, tc.lenders...)...),
				admission.WithMethods("heavy", r18HeavyM), admission.WithMethods("batch", "/demo.Batch/"),
				admission.WithDegradation(admission.Degradation{Window: time.Second, ExitAfter: 3}))
			require.Equal(t, tc.normal, h.heavyRuns(), "Normal")
			if len(tc.lenders) == 2 {
				// batch borrows spare's idle slots while Normal: 4 in all.
				var ps []*admission.Permit
				for range 4 {
					ps = append(ps, h.admitted(work("/demo.Batch/Do")))
				}
				h.refused(work("/demo.Batch/Do"), status.ReasonConcurrencyFull)
				for _, p := range ps {
					h.release(p)
				}
			}
			h.override(admission.Override{Actor: "a", Reason: "r", TTL: time.Minute, Mode: admission.ModeDegraded})
			require.Equal(t, tc.degrade, h.heavyRuns(), "Degraded")
			h.override(admission.Override{Actor: "a", Reason: "r", TTL: time.Minute, Mode: admission.ModeRecovering})
			// Forced Recovering on the state machine's first step (1 of 3
			// healthy windows): ⌈4·1/3⌉ = 2 of batch's slots.
			require.Equal(t, tc.recovering, h.heavyRuns(), "Recovering")
		})
	}
}

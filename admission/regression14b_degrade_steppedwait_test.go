package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A review found that the first fix stopped counting the refusals that Recovering's stepped re-admission
// of an optional class causes, so that an optional load that fits the
// class's configured slots lets the controller return to Normal. The same
// step's waits are still an overload signal: an optional class with a queue
// (3 slots, 3 queued) carries three concurrent requests of 250 ms, which its
// configured slots run at once, without a wait. Stepped to one slot while
// Recovering, two of them wait in the queue behind it, their wait reaches
// MaxQueueAge (200 ms), every Recovering window is overloaded, and the
// controller never returns to Normal with the main class idle — the bug
// 0e0b954 fixed, for any optional class that queues instead of refusing.
func TestRegression14bSteppedWaitsStillNeverLetItRecover(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, QueueItems: 3, Optional: true},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
			MaxQueueAge: 200 * time.Millisecond,
		}))
	// One window's optional load: three requests of 250 ms each, arriving
	// together; it returns how many of them had to wait.
	optRound := func() (waited int) {
		var running []*admission.Permit
		var queued []int
		for range 3 {
			id, e := h.arrive(work(optM))
			switch e.Kind {
			case admission.EventAdmitted:
				running = append(running, h.take(id).permit)
			case admission.EventQueued:
				queued = append(queued, id)
				waited++
			case admission.EventRefused:
				h.take(id)
				if e.Reason != status.ReasonShed { // shed while Degraded
					t.Fatalf("optional request refused %v", status.ReasonName(e.Reason))
				}
			default:
				t.Fatalf("optional request %v %v", e.Kind, status.ReasonName(e.Reason))
			}
		}
		for len(running) > 0 {
			h.tick(250 * time.Millisecond)
			for _, p := range running {
				h.release(p)
			}
			running = running[:0]
			rest := queued[:0]
			for _, id := range queued {
				if r, ok := h.done[id]; ok {
					delete(h.done, id)
					if r.err != nil {
						t.Fatalf("waiter %d: %v", id, r.err)
					}
					running = append(running, r.permit)
				} else {
					rest = append(rest, id)
				}
			}
			queued = rest
		}
		return waited
	}
	// Advance to the end of the current 1 s window.
	endWindow := func() {
		since := h.clk.Now().Sub(epoch) % time.Second
		h.tick(time.Second - since)
	}
	if w := optRound(); w != 0 {
		t.Fatalf("Normal: %d optional requests waited; the load fits the configured slots", w)
	}
	endWindow()
	// One overloaded window of main: Degraded.
	p := h.admitted(work(mainM))
	h.refused(work(mainM), status.ReasonConcurrencyFull)
	h.release(p)
	endWindow()
	if m := h.ctrl.Mode(); m != admission.ModeDegraded {
		t.Fatalf("mode %v, want DEGRADED", m)
	}
	var modes []admission.Mode
	for range 40 {
		optRound()
		endWindow()
		m := h.ctrl.Mode()
		modes = append(modes, m)
		if m == admission.ModeNormal {
			return
		}
	}
	t.Fatalf("40 windows with main idle and an optional load that fits its 3 configured slots without a wait: never NORMAL again; modes %v", modes)
}

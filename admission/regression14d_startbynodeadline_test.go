package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A request with StartBy and no Deadline (Request's fields; zero: none) is
// refused DEADLINE_UNREACHABLE by the StartBy check and remembered with a
// zero deadline. judgeRejects then asks whether now plus the mean service
// time is after that zero deadline — always true — so the refusal is never
// judged a false reject, even when a later arrival starts within StartBy.
// With any Deadline set, the same sequence counts one false reject.
func TestRegression14dAdmission14StartByWithoutDeadlineNeverFalseReject(t *testing.T) {
	for _, withDeadline := range []bool{true, false} {
		name := "deadline"
		if !withDeadline {
			name = "no-deadline"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, admission.WithClasses(
				admission.Class{Name: "A", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}))
			p := h.admitted(work("/demo.A/Do"))

			h.tick(time.Millisecond)
			short := work("/demo.A/Do")
			if withDeadline {
				short.Deadline = h.clk.Now().Add(time.Hour)
			}
			short.StartBy = h.clk.Now().Add(50 * time.Millisecond)
			h.refused(short, status.ReasonDeadlineUnreachable)

			// The slot frees 1 ms later, and a later request starts at once,
			// 2 ms after the refusal: well within the refused one's StartBy.
			h.tick(time.Millisecond)
			h.release(p)
			h.tick(time.Millisecond)
			later := h.admitted(work("/demo.A/Do"))
			later.Abandon()

			st, _ := h.ctrl.Stats().Class("A")
			if st.FalseRejects != 1 {
				t.Fatalf("FalseRejects = %d, want 1: a later request started 2 ms after the refusal, within its 50 ms StartBy (deadline set: %v)", st.FalseRejects, withDeadline)
			}
		})
	}
}

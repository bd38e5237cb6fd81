package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A review found that a StartBy refusal was remembered for the false-reject judgement with the
// request's Deadline only (rememberReject(cs, r.Deadline, now)), and
// judgeRejects counts it a false reject when a later arrival starts in time
// to finish by that Deadline. But the request had to *start* by StartBy:
// a later arrival that starts long after StartBy shows the refusal was right.
// Every StartBy refusal of a detached recorded try (Deadline = the attempt's,
// StartBy = the try's, much earlier) is thus judged avoidable, inflating
// FalseRejects and tollgate.admission.false_rejects.
func TestRegression14cStartByRefusalJudgedFalseReject(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "A", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}))
	p := h.admitted(work("/demo.A/Do"))

	h.tick(time.Millisecond)
	short := work("/demo.A/Do")
	short.Deadline = h.clk.Now().Add(time.Hour)
	short.StartBy = h.clk.Now().Add(10 * time.Millisecond)
	h.refused(short, status.ReasonDeadlineUnreachable)

	h.tick(time.Millisecond)
	later := work("/demo.A/Do")
	later.Deadline = h.clk.Now().Add(time.Hour)
	id := h.queued(later)

	// The slot frees 5 s later: the refused request, had it been queued,
	// would have started then, long after its StartBy.
	h.tick(5 * time.Second)
	h.release(p)
	r := h.take(id)
	if r.err != nil {
		t.Fatalf("later request: %v", r.err)
	}
	r.permit.Abandon()
	st, _ := h.ctrl.Stats().Class("A")
	if st.FalseRejects != 0 {
		t.Fatalf("FalseRejects = %d, want 0: the refused request had to start within 10 ms and the slot freed after 5 s", st.FalseRejects)
	}
}

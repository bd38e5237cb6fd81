package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Request.StartBy: a request whose caller stops waiting before its work's
// deadline (a recorded unary try, whose handler runs detached until the
// attempt's deadline) is refused DEADLINE_UNREACHABLE when the predicted
// wait ends after it, instead of being queued to be dropped when its caller
// gives up; with time to wait, it is queued as before.
func TestRegression14bStartByBoundsTheWait(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "A", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}))
	p := h.admitted(work("/demo.A/Do"))
	defer p.Abandon()

	short := work("/demo.A/Do")
	short.Deadline = h.clk.Now().Add(time.Hour)
	short.StartBy = h.clk.Now().Add(10 * time.Millisecond)
	h.refused(short, status.ReasonDeadlineUnreachable)

	long := work("/demo.A/Do")
	long.Deadline = h.clk.Now().Add(time.Hour)
	long.StartBy = h.clk.Now().Add(time.Minute)
	h.queued(long)
	for _, r := range h.done {
		if r.permit != nil {
			r.permit.Abandon()
		}
	}
}

package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A DEADLINE_UNREACHABLE refusal of a request held back only by its own
// tenant's running limit is remembered like any other (decideLocked's
// refuse calls rememberReject), and judgeRejects then counts it a false
// reject as soon as any other tenant's request starts in time — although
// the refused request could not have started before its tenant's running
// request ended. Main (2 slots, TenantRunning 1, 100 ms): a runs R_a; a's
// second request with 150 ms to spare is refused (it would start at
// +100 ms and end at +200 ms: correct). Tenant d's request then starts at
// once on the free slot: the refusal is counted a false reject, so the
// false_rejects metric reports the tenant limit doing its job as the
// predictor's error.
func TestRegression8TenantHeldRejectCountedFalse(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "main", Slots: 2, QueueItems: 4, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDefaultClass("main"))
	a := work("/demo.Main/Do")
	a.Tenant = "a"
	pa := h.admitted(a)
	defer pa.Abandon()
	a2 := a
	a2.Deadline = h.clk.Now().Add(150 * time.Millisecond)
	h.refused(a2, status.ReasonDeadlineUnreachable) // correct: it starts at +100 ms at best
	d := work("/demo.Main/Do")
	d.Tenant = "d"
	pd := h.admitted(d) // another tenant, free slot
	defer pd.Abandon()
	for _, cs := range h.ctrl.Stats().Classes {
		if cs.Name == "main" && cs.FalseRejects != 0 {
			t.Fatalf("FalseRejects = %d: a's refusal (held by its own running limit until +100 ms, 100 ms of service, 150 ms to spare) was judged avoidable because tenant d started at once", cs.FalseRejects)
		}
	}
}

package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// 630d02b makes a release drop its own class's hopeless waiters when the
// class has no tenant limits, "tenant-limited classes did already" — but
// those are dropped only under StageTenant. A class configured with
// TenantRunning whose tenant stage is switched off (WithStages) gets
// neither: it behaves as a plain class (no tenant limit applies), yet its
// release leaves a waiter the new estimate made hopeless in place behind a
// waiter that cannot start, where pump's walk does not reach it (and on the
// real clock its timer, armed by the old estimate, fires late). The same
// scenario with TenantRunning 0 drops it at the release.
func TestRegression12ReleaseKeepsHopelessWaiterWhenTenantStageOff(t *testing.T) {
	for _, tr := range []int{0, 1} {
		h := newHarness(t, admission.WithClasses(
			admission.Class{Name: "B", Slots: 1, QueueItems: 2, TenantRunning: tr, ExpectedServiceTime: 10 * time.Millisecond, MaxServiceTime: time.Hour},
			admission.Class{Name: "L", Slots: 1, QueueItems: 1, LendIdle: true, ExpectedServiceTime: 10 * time.Millisecond}),
			admission.WithMethods("B", "/demo.B/"), admission.WithMethods("L", "/demo.L/"),
			admission.WithDefaultClass("B"),
			admission.WithLearningRate(1),
			admission.WithStages(admission.AllStages&^admission.StageDegradation&^admission.StageTenant))
		b1 := h.admitted(work("/demo.B/Do"))
		b2 := h.admitted(work("/demo.B/Do")) // on L's idle slot
		h.queued(work("/demo.L/Do"))         // W_L
		h.queued(work("/demo.B/Do"))         // W_A
		rd := work("/demo.B/Do")
		rd.Deadline = h.clk.Now().Add(time.Minute)
		h.queued(rd) // W_D

		h.clk.Advance(40 * time.Second)
		evs := h.release(b2) // B learns 40s: W_D cannot finish by t0+60s any more
		dropped := false
		for _, e := range evs {
			if e.Kind == admission.EventDropped && e.Deadline.Equal(rd.Deadline) {
				dropped = true
			}
		}
		st, _ := h.ctrl.Stats().Class("B")
		for _, r := range h.done {
			if r.permit != nil {
				r.permit.Abandon()
			}
		}
		b1.Abandon()
		h.drain()
		require.True(t, dropped, "TenantRunning=%d, tenant stage off: the release left hopeless W_D queued (B queued %d)", tr, st.Queued)
	}
}

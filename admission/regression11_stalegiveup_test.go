package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"google.golang.org/grpc/tap"
)

// A release that raises its class's learned service time can leave that
// class's waiters unable to finish by their deadlines: the README promises
// such a waiter is dropped "when a slot frees, a request of its class
// arrives, or (real clock) by its own timer the moment its deadline less the
// service estimate passes". In a class without tenant limits, the release
// drops them only in pumpPass's walk, which stops at the first waiter that
// cannot start; the give-up timer was armed with the old estimate (it is
// re-read only when it fires), so on the real clock it fires late by the
// estimate's rise. Meanwhile the hopeless waiter keeps its place: a class
// whose queue it fills is flagged full, and the tap refuses QUEUE_FULL (and
// counts it as overload) what Admit, which drops the waiter first, queues.
//
// B (1 slot, 2 queued, expected 10ms, learning rate 1) runs B1 on its own
// slot and B2 on L's idle slot; L then queues its own W_L. B queues W_A (no
// deadline) and W_D (deadline t0+60s). At t0+40s B2 is released: B's mean
// becomes 40s, so W_D (t0+40s+40s > t0+60s) can no longer finish. L's slot
// goes to W_L; W_A cannot start, the walk stops there, W_D stays, B's queue
// stays full and its tap flag QUEUE_FULL. Admit of a B request at the same
// instant drops W_D and queues the request.
func TestRegression11StaleGiveUpTapRefusesWhatAdmitQueues(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "B", Slots: 1, QueueItems: 2, ExpectedServiceTime: 10 * time.Millisecond, MaxServiceTime: time.Hour},
		admission.Class{Name: "L", Slots: 1, QueueItems: 1, LendIdle: true, ExpectedServiceTime: 10 * time.Millisecond}),
		admission.WithMethods("B", "/demo.B/"), admission.WithMethods("L", "/demo.L/"),
		admission.WithDefaultClass("B"),
		admission.WithLearningRate(1),
		admission.WithStages(admission.AllStages&^admission.StageDegradation))
	b1 := h.admitted(work("/demo.B/Do"))
	defer b1.Abandon()
	b2 := h.admitted(work("/demo.B/Do")) // on L's idle slot
	h.queued(work("/demo.L/Do"))         // W_L: L lends no more
	h.queued(work("/demo.B/Do"))         // W_A
	rd := work("/demo.B/Do")
	rd.Deadline = h.clk.Now().Add(time.Minute)
	h.queued(rd) // W_D

	h.clk.Advance(40 * time.Second)
	h.release(b2) // B learns 40s: W_D cannot finish by t0+60s any more
	for _, r := range h.done {
		if r.permit != nil {
			defer r.permit.Abandon() // W_L, started on L's slot
		}
	}
	st, _ := h.ctrl.Stats().Class("B")
	_, tapErr := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: "/demo.B/Do"})

	id, e := h.arrive(work("/demo.B/Do")) // Admit at the same instant
	if r, ok := h.done[id]; ok && r.permit != nil {
		r.permit.Abandon()
	}
	require.Equal(t, admission.EventQueued, e.Kind, "Admit takes the request: it drops W_D first")
	require.NoError(t, tapErr,
		"the tap refused what Admit queued at the same instant: B's queue held %d (W_D past hope since the release)", st.Queued)
}

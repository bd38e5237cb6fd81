package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

// The tap lets requests through once now >= hopeless (the queue's earliest
// deadline less the service estimate), but a waiter that would finish
// exactly at its deadline is not expired (expiredLocked uses After, and the
// README says finishing exactly at the deadline is still useful). At that
// instant Admit drops nothing, refuses QUEUE_FULL and leaves the bound (and
// so hopeless) where it was: the tap then lets through every request for
// as long as the clock reads that instant (a virtual clock can hold it),
// each one refused by Admit — the tap no longer filters anything.
func TestRegression12TapOpensAtExactHopelessInstant(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "B", Slots: 1, QueueItems: 1, ExpectedServiceTime: 10 * time.Second}),
		admission.WithDefaultClass("B"),
		admission.WithStages(admission.AllStages&^admission.StageDegradation))
	b1 := h.admitted(work("/demo.B/Do"))
	defer b1.Abandon()
	w := work("/demo.B/Do")
	w.Deadline = epoch.Add(60 * time.Second)
	h.queued(w) // queue full; the waiter can finish by its deadline until t0+50s inclusive

	h.clk.Advance(50 * time.Second) // exactly deadline - service: the waiter can still finish
	passed := 0
	for range 100 {
		if _, err := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: "/demo.B/Do"}); err == nil {
			passed++
		}
		h.refused(work("/demo.B/Do"), status.ReasonQueueFull) // Admit drops nothing: the waiter is not expired
	}
	st, _ := h.ctrl.Stats().Class("B")
	require.Equal(t, 1, st.Queued, "the waiter, able to finish exactly at its deadline, stays")
	require.Zero(t, passed, "the tap let through %d of 100 requests that Admit refused QUEUE_FULL at the same instant", passed)
}

package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A service owner found that a class with no ExpectedServiceTime and nothing
// learned yet reported PredictedWait 0 while its only slot was taken, and
// that its refusals suggested the ~10 ms floor however long the running
// request had already run (one permit held 2 s: CONCURRENCY_FULL with a
// retry-after of 6–15 ms). With nothing learned, the time a running request
// has run is a lower bound of its service time; it is expected to run as
// long again, and each waiter to take as long as the running ones have.

const unknownM = "/demo.Unknown/Do"

func TestR18aUnknownServiceTimePredictsFromTheRunningWork(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "a", Slots: 1}),
		admission.WithDefaultClass("a"))
	p := h.admitted(work(unknownM))
	h.tick(2 * time.Second) // it has run 2 s

	st, ok := h.ctrl.Stats().Class("a")
	require.True(t, ok)
	require.Equal(t, 1, st.UsedSlots)
	require.Equal(t, 2*time.Second, st.PredictedWait, "no slot free: the running request is expected to run as long again")
	for range 20 {
		err := h.refused(work(unknownM), status.ReasonConcurrencyFull)
		ra, ok := status.RetryAfter(err)
		require.True(t, ok)
		require.GreaterOrEqual(t, ra, time.Second, "retry-after %v, jittered from a 2 s wait", ra)
		require.Less(t, ra, 3*time.Second)
		ra = h.ctrl.RetryAfter("a")
		require.GreaterOrEqual(t, ra, time.Second)
		require.Less(t, ra, 3*time.Second)
	}
	h.release(p)
	st, _ = h.ctrl.Stats().Class("a")
	require.Zero(t, st.PredictedWait, "a slot free")
}

func TestR18aUnknownServiceTimeCountsTheQueueButDecidesAsBefore(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "a", Slots: 2, QueueItems: 4}),
		admission.WithDefaultClass("a"))
	p1 := h.admitted(work(unknownM))
	h.tick(time.Second)
	p2 := h.admitted(work(unknownM))
	h.tick(time.Second) // they have run 2 s and 1 s: 1.5 s on average
	// With nothing learned the deadline stage still cannot judge: a
	// request with 100 ms left waits, as before.
	r := work(unknownM)
	r.Deadline = h.clk.Now().Add(100 * time.Millisecond)
	id := h.queued(r)

	st, _ := h.ctrl.Stats().Class("a")
	require.Equal(t, 1, st.Queued)
	// (2 s + 1 s running as long again, + 1 waiter × 1.5 s) over 2 slots.
	require.Equal(t, 2250*time.Millisecond, st.PredictedWait)

	p1.Abandon() // frees the slot and teaches nothing: the waiter starts
	h.drain()
	res := h.take(id)
	require.NoError(t, res.err)
	h.release(res.permit)
	h.release(p2)
}

func TestR18aControlClassPredictsFromTheRunningWork(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1}), admission.WithDefaultClass("a"))
	q := admission.Request{Method: "/tollgate.v1.AttemptService/GetAttempt", Size: -1}
	p1, p2 := h.admitted(q), h.admitted(q)
	h.tick(500 * time.Millisecond)
	st, ok := h.ctrl.Stats().Class(admission.ControlClass)
	require.True(t, ok)
	require.Equal(t, 500*time.Millisecond, st.PredictedWait)
	h.release(p1)
	h.release(p2)
}

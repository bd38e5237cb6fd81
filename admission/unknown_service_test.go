package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Found by review: a class without ExpectedServiceTime that has learned
// nothing predicts no service time, so the deadline stage compared the
// deadline with now + 0: a request whose deadline was exactly now, with no
// time left for any work, was admitted (and a waiter reaching a slot at its
// deadline was started). At its deadline a request has expired (its
// context is done; seed 003: "a request admitted exactly at its deadline
// cannot finish"), and expired work never starts (invariant 9), at
// admission and at dequeue.
func TestUnknownServiceTimeNeverStartsAtTheDeadline(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 2}))
	now := h.clk.Now()
	h.refused(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(-time.Nanosecond)}, status.ReasonDeadlineExpired)
	h.refused(admission.Request{Method: heavyM, Size: -1, Deadline: now}, status.ReasonDeadlineExpired)
	// Any time left is room for work of unknown length (documented).
	p := h.admitted(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(time.Nanosecond)})

	q := h.queued(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(time.Second)})
	h.clk.Advance(time.Second)
	p.Abandon() // teaches nothing: the service time stays unknown
	h.drain()
	r := h.take(q)
	require.Nil(t, r.permit, "the waiter reached its slot at its deadline")
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(r.err).Reason)
}

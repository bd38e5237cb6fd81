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

// Invariant 9, "a job that would finish exactly at its deadline is
// still useful". A class that has *learned* a service time of 0 (every
// request so far released at the instant it started, as on a simulation's
// virtual clock) predicts that a request arriving at its deadline finishes
// exactly at it; a review found it refused DEADLINE_EXPIRED, as if the service
// time were unknown (only an unknown one makes the deadline itself expired).
func TestLearnedZeroServiceTimeStartsAtTheDeadline(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 2}))
	p := h.admitted(admission.Request{Method: heavyM, Size: -1})
	h.release(p) // at the instant it started: the class learns 0
	now := h.clk.Now()
	q := h.admitted(admission.Request{Method: heavyM, Size: -1, Deadline: now})
	h.release(q)
}

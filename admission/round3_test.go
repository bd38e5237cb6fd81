package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A review found that a waiter whose context ended brings the controller's
// time-driven state up to date before it leaves (so that the windows it
// waited through see it waiting), and that this could start the very
// waiter that was leaving: an override that lowered its class's slots had
// expired since anything last looked, and the pump that follows the expiry
// handed the ended waiter a permit. Its client is gone: a detached unary
// handler would run for nobody, on a slot others wait for. The ended waiter
// leaves as a cancelled one; the slot goes to the next waiter.
func TestEndedWaiterIsNotStartedByTheStateItBringsUpToDate(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "main", Slots: 2, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}))
	h.override(admission.Override{Actor: "test", Reason: "one slot", Class: "main", Slots: 1, TTL: time.Second})
	p := h.admitted(work(mainM))
	gone := h.queued(work(mainM))
	next := h.queued(work(mainM))

	h.clk.Advance(2 * time.Second) // the override has expired; nothing has looked since
	h.cancels[gone]()
	var r result
	for r.id != gone {
		select {
		case r = <-h.results:
			if r.id != gone {
				h.done[r.id] = r
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the ended waiter got no answer")
		}
	}
	if r.permit != nil {
		r.permit.Abandon() // keep the harness's invariant check clean either way
	}
	require.Nil(t, r.permit, "an ended waiter was handed a permit")
	require.True(t, errors.Is(r.err, context.Canceled), "%v", r.err)
	require.Equal(t, status.ReasonUnspecified, status.OutcomeOf(r.err).Reason, "%v", r.err)

	// The slot the expiry freed went to the waiter behind it.
	for {
		if res, ok := h.done[next]; ok {
			require.NoError(t, res.err)
			res.permit.Release()
			break
		}
		select {
		case res := <-h.results:
			h.done[res.id] = res
		case <-time.After(10 * time.Second):
			t.Fatal("the next waiter did not start")
		}
	}
	p.Release()
	st, _ := h.ctrl.Stats().Class("main")
	require.Equal(t, 0, st.Running)
	require.Equal(t, uint64(1), st.Cancelled)
}

// A review found that an observer (WithObserver) that panics did so in the
// controller's unlock, after the lock was released: Admit lost the permit
// it had just created, whose slot then never came back (invariant 9), and a
// panic on the controller's own timer (an override's expiry starting a
// waiter) would end the process. The controller recovers an observer's
// panic, counts it (Stats.ObserverPanics) and goes on: the caller gets its
// permit, and the event is lost.
func TestPanickingObserverLeaksNoSlot(t *testing.T) {
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 1}),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventAdmitted || e.Kind == admission.EventReleased {
				panic("observer bug")
			}
		}))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ctrl.Close()) })

	for range 3 {
		var p *admission.Permit
		require.NotPanics(t, func() { p, err = ctrl.Admit(context.Background(), work(mainM)) })
		require.NoError(t, err)
		require.NotNil(t, p)
		require.NotPanics(t, p.Release)
	}
	s := ctrl.Stats()
	st, _ := s.Class("main")
	require.Equal(t, 0, st.Running, "every permit came back")
	require.Equal(t, uint64(3), st.Admitted)
	require.Equal(t, uint64(6), s.ObserverPanics)
}

// A review found that a class whose slots are lowered (an override) and
// that both lends a slot and borrows one predicted its wait from one
// play-out of both kinds of request: those on its own slots, whoever runs
// them, and its own on borrowed slots, all gating the start of its next
// request together. It starts one as soon as fewer of its own run than its
// lowered slots and a slot is free — its own, or the one it had borrowed,
// which its request's end gives back to be borrowed again. Here its own
// stream on a borrowed slot ends in about 100ms while another class's
// stream, long-lived, holds the slot it lent: the request would start in
// ~100ms, but was refused DEADLINE_UNREACHABLE for the long stream.
func TestLoweredClassThatLendsAndBorrowsPredictsItsOwnEnd(t *testing.T) {
	h := newHarness(t, lendAndBorrowOptions(0)...)
	long := h.longBorrowedStream()

	own := h.admitted(streamOn(mainM)) // on opt's other slot
	short := h.shortStream()           // opt is full: borrows the lender's idle slot
	own.Abandon()
	h.drain()
	h.override(admission.Override{Actor: "test", Reason: "one slot", Class: "opt", Slots: 1, TTL: time.Hour})
	st, _ := h.ctrl.Stats().Class("opt")
	require.Equal(t, 1, st.Running, "its stream on the lender's slot")
	require.Equal(t, 1, st.UsedSlots, "b's stream on its slot")

	// Deadline in 2s: a wait of ~100ms and 100ms of work fit; 10s do not.
	id, e := h.arriveWithin2s()
	require.Equal(t, admission.EventQueued, e.Kind, "reason %v", e.Reason)

	// And it does start once its class's stream ends, long before b's.
	h.clk.Advance(100 * time.Millisecond)
	short.Release()
	h.drain()
	res := h.take(id)
	require.NoError(t, res.err)
	res.permit.Release()
	long.Abandon()
	h.drain()
}

// A review found that bringing the state up to date over a long gap (a
// virtual clock; a real one whose timer ran late) expired the overrides
// first, at the gap's end, and closed the windows of the gap after: the
// windows that ended while an override was in force were judged without
// it, and a class the expiry released from Recovering's step (forced by
// the override) counted its waits only from the gap's end. Here an
// optional request waits from the override's expiry (2s) on, unstepped,
// for far longer than MaxQueueAge: the windows after the expiry are
// overloaded, and the controller degrades, shedding it. Before, every
// window was judged healthy and the request waited on.
func TestWindowsBeforeAnOverridesExpiryAreJudgedWithIt(t *testing.T) {
	t.Run("looked in time", func(t *testing.T) { windowsAcrossAnExpiry(t, true) })
	t.Run("after a gap", func(t *testing.T) { windowsAcrossAnExpiry(t, false) })
}

// windowsAcrossAnExpiry is the scenario above; ticked: something looks
// every 100ms, as the real clock's timer would at the override's expiry.
func windowsAcrossAnExpiry(t *testing.T, ticked bool) {
	h, reader := newMeteredHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, QueueItems: 4, Optional: true},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 100, MinDecisions: 1000, MaxQueueAge: 2 * time.Second,
		}))
	var running []*admission.Permit
	for range 3 {
		running = append(running, h.admitted(work(optM)))
	}
	h.override(admission.Override{Actor: "test", Reason: "step", Mode: admission.ModeRecovering, TTL: 2 * time.Second})
	w := h.queued(work(optM)) // stepped to one slot; three run

	if ticked {
		for range 99 {
			h.tick(100 * time.Millisecond)
		}
		h.clk.Advance(100 * time.Millisecond)
	} else {
		h.clk.Advance(10 * time.Second) // nothing looks until now
	}
	// The metrics' peek (which changes nothing) sees what Mode will.
	peeked := peekedMode(t, reader)
	mode := h.ctrl.Mode()
	require.NotEqual(t, admission.ModeNormal, mode,
		"from 2s on the request waited unstepped, past MaxQueueAge by 4s")
	require.Equal(t, mode, peeked)
	h.drain()
	res := h.take(w)
	require.Equal(t, status.ReasonShed, status.OutcomeOf(res.err).Reason, "%v", res.err)
	for _, p := range running {
		p.Release()
	}
	h.drain()
}

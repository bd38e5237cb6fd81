package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// A review found that, over a gap in which an override expired, advance
// started the waiter the expiry let start (at the gap's end) before it
// closed the windows after the expiry: those windows no longer saw it
// waiting, and its whole wait, measured to the gap's end, counted in the
// window open at the expiry. The metrics' peek, which starts nothing,
// closed the same windows with the waiter still waiting: the mode gauge
// said Degraded while Mode said Recovering. The waiter starts at the gap's
// end, after the windows that end by then are closed, as a start
// Recovering's step lets happen does (rollWindows).
func TestExpiryStartsItsWaitersAfterTheGapsWindows(t *testing.T) {
	h, reader := newMeteredHarness(t,
		admission.WithClasses(admission.Class{Name: "main", Slots: 2, QueueItems: 4}),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 100, MinDecisions: 1000, MaxQueueAge: 2 * time.Second,
		}))
	h.override(admission.Override{Actor: "test", Reason: "one slot", Class: "main", Slots: 1, TTL: time.Second})
	p := h.admitted(work(mainM))
	w := h.queued(work(mainM)) // the override holds it; it expires at 1s

	h.clk.Advance(10 * time.Second) // nothing looks until now
	peeked := peekedMode(t, reader)
	mode := h.ctrl.Mode()
	require.Equal(t, mode, peeked, "the mode gauge predicts Mode")
	require.Equal(t, admission.ModeDegraded, mode,
		"the request waited through the windows ending 2s..10s, past MaxQueueAge")
	h.drain()
	res := h.take(w)
	require.NoError(t, res.err)
	res.permit.Release()
	p.Release()
	h.drain()
}

// A review found that a lowered class that lends and borrows counted the
// slot its request borrowed as one it gets back when that request ends,
// even while the lender had requests of its own waiting: the slot goes to
// them then (a lender with waiters lends nothing), and the class's next
// request waits for its own slot, held by another class's long stream.
// Predicted to start in ~100ms, it was queued, to be dropped at its
// deadline instead of refused DEADLINE_UNREACHABLE at once.
func TestLoweredClassDoesNotCountOnASlotItsLenderWaitsFor(t *testing.T) {
	h := newHarness(t, lendAndBorrowOptions(2)...)
	long := h.longBorrowedStream()

	own := h.admitted(streamOn(mainM)) // on opt's other slot
	short := h.shortStream()           // opt is full: borrows the lender's idle slot
	h.override(admission.Override{Actor: "test", Reason: "one slot", Class: "opt", Slots: 1, TTL: time.Hour})
	lw := h.queued(work(lenderM)) // the lender's own request waits for its slot
	own.Abandon()                 // opt, lowered to one slot, lends nothing
	h.drain()
	st, _ := h.ctrl.Stats().Class("opt")
	require.Equal(t, 1, st.Running, "its stream on the lender's slot")
	require.Equal(t, 1, st.UsedSlots, "b's stream on its slot")

	// Deadline in 2s: the slot short holds goes to the lender's waiter,
	// and opt's own slot frees only with b's long stream (~10s).
	h.refusedUnreachableBeforeShortEnds(t, short, "its lender waits for")
	res := h.take(lw)
	require.NoError(t, res.err, "the lender's waiter takes its slot back")
	res.permit.Release()
	long.Abandon()
	h.drain()
}

// A review found that a lowered class whose own slots another class's
// long stream holds predicted its wait from that stream's end even while
// another class lent an idle slot: once fewer of its own requests run
// than its lowered slots, its next request borrows the idle slot at once.
// Predicted to wait ~10s, it was refused DEADLINE_UNREACHABLE, although it
// would have started in ~100ms.
func TestLoweredClassCountsAnIdleLendersSlot(t *testing.T) {
	h := newHarness(t, lendAndBorrowOptions(0)...)
	long := h.longBorrowedStream()

	short := h.shortStream() // on opt's other slot
	h.override(admission.Override{Actor: "test", Reason: "one slot", Class: "opt", Slots: 1, TTL: time.Hour})

	// Deadline in 2s: once short ends, the lender's idle slot takes it.
	id, e := h.arriveWithin2s()
	require.Equal(t, admission.EventQueued, e.Kind, "reason %v", e.Reason)
	h.clk.Advance(100 * time.Millisecond)
	short.Release()
	h.drain()
	res := h.take(id)
	require.NoError(t, res.err)
	require.Equal(t, "opt", res.permit.Class())
	res.permit.Release()
	long.Abandon()
	h.drain()
}

// Several overrides expiring in one gap, a forced mode among them, with a
// request waiting through it: whatever the gap, the metrics' peek and Mode
// agree.
func TestPeekAgreesWithModeAcrossSeveralExpiries(t *testing.T) {
	for _, gap := range []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 2500 * time.Millisecond, 3 * time.Second, 4500 * time.Millisecond, 9 * time.Second, 30 * time.Second} {
		t.Run(gap.String(), func(t *testing.T) {
			h, reader := newMeteredHarness(t,
				admission.WithClasses(
					admission.Class{Name: "main", Slots: 2, QueueItems: 4},
					admission.Class{Name: "opt", Slots: 2, QueueItems: 4, Optional: true}),
				admission.WithMethods("opt", optM),
				admission.WithDegradation(admission.Degradation{
					Window: time.Second, EnterAfter: 2, ExitAfter: 3, MinDecisions: 1000, MaxQueueAge: 1500 * time.Millisecond,
				}))
			set := func(o admission.Override) {
				o.Actor, o.Reason = "test", "gap"
				h.override(o)
			}
			p := h.admitted(work(mainM))
			set(admission.Override{Class: "main", Slots: 1, TTL: 2 * time.Second})
			set(admission.Override{Mode: admission.ModeRecovering, TTL: 1 * time.Second})
			set(admission.Override{Mode: admission.ModeNormal, TTL: 3 * time.Second})
			w := h.queued(work(mainM))
			h.clk.Advance(gap)
			require.Equal(t, h.ctrl.Mode(), peekedMode(t, reader))
			h.drain()
			if res, ok := h.done[w]; ok && res.permit != nil {
				res.permit.Release()
			}
			p.Release()
			h.drain()
		})
	}
}

// A review found that a lowered class counted on borrowing again the slot
// its request held once it ended even while a class before it (pump's
// order) waited for a loan: that class takes the slot first, and the
// request, predicted to start in ~100ms, was queued to be dropped at its
// deadline instead of refused DEADLINE_UNREACHABLE at once.
func TestLoweredClassDoesNotCountOnASlotAnEarlierClassWaitsFor(t *testing.T) {
	const aM = "/demo.A/Do"
	h := newHarness(t, append(lendAndBorrowOptions(0,
		admission.Class{Name: "a", Slots: 1, QueueItems: 2, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDefaultClass("opt"),
		admission.WithMethods("a", "/demo.A/"))...)
	long := h.longBorrowedStream()

	own := h.admitted(streamOn(mainM)) // on opt's other slot
	short := h.shortStream()           // opt is full: borrows the lender's idle slot
	h.override(admission.Override{Actor: "test", Reason: "one slot", Class: "opt", Slots: 1, TTL: time.Hour})
	a1 := h.admitted(streamOn(aM))
	aw := h.queued(work(aM)) // a is full, nobody lends: it waits for a loan
	own.Abandon()
	h.drain()

	h.refusedUnreachableBeforeShortEnds(t, short, "a class before it waits for")
	res := h.take(aw)
	require.NoError(t, res.err, "a's waiter borrows the lender's slot")
	require.Equal(t, "a", res.permit.Class())
	res.permit.Release()
	a1.Abandon()
	long.Abandon()
	h.drain()
}

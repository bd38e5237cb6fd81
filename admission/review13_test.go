package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Review 13 found that a waiter whose context ended pumped the queues only
// on the real clock: on a controller reading a clock of its own
// (WithClock) through Admit, ctxEnded left the waiters that its leaving let
// start queued — a lending class whose only waiter left lends its idle slot
// again, and another class's waiter waited for that slot until some later
// call happened to pump. The leaving is an event at the controller's time
// like a release: what it lets start starts then.
func TestLeavingWaiterStartsWhatItsLeavingLetsStartOnTheControllersClock(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "b", Slots: 1, QueueItems: 2, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "lender", Slots: 2, QueueItems: 2, LendIdle: true, TenantRunning: 1,
				ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithMethods("lender", "/demo.Lender/"),
	)
	tr := work(lenderM)
	tr.Tenant = "t"
	running := h.admitted(tr) // the tenant's one running request: one of the lender's two slots idle
	held := h.queued(tr)      // held by its tenant's limit: the lender lends nothing while it waits
	b1 := h.admitted(work(mainM))
	b2 := h.queued(work(mainM)) // b's slot is taken; the lender has a waiter

	res := h.cancel(held) // the lender's queue empties: its idle slot is lendable
	require.Equal(t, status.ReasonUnspecified, status.OutcomeOf(res.err).Reason)
	started := false
	for _, e := range h.cancelEvents {
		started = started || (e.Kind == admission.EventStarted && e.Class == "b")
	}
	require.True(t, started, "b's waiter stays queued though the lender's idle slot is free: %v", h.cancelEvents)
	r := h.take(b2)
	require.NoError(t, r.err)
	r.permit.Release()
	b1.Release()
	running.Release()
	h.drain()
}

// Review 13 found that the dequeue stage refused a waiter that could no
// longer finish by its deadline DEADLINE_EXPIRED final, with no delay, even
// when a repeat could still be admitted and finish: here the learned
// estimate (3s) is inflated, so the waiter (1s left) is dropped when the
// slot frees, and a repeat at that same instant finds the class idle, is
// admitted on the configured expected time (the idle probe, 100ms), and
// would finish long before the deadline. Final says no repeat within the
// attempt can succeed (README "Which deadline refusals are final"): such a
// drop is a prediction, as the arrival's DEADLINE_UNREACHABLE is, and is
// refused not final, with a delay. A drop that even the probe's plan could
// not save stays final (TestDeadlineStage).
func TestDequeueDropBeforeTheDeadlineIsNotFinal(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 2,
		ExpectedServiceTime: 100 * time.Millisecond}))
	for range 3 { // teach an inflated estimate: 3s a request
		p := h.admitted(work(mainM))
		h.clk.Advance(3 * time.Second)
		h.release(p)
	}
	p := h.admitted(work(mainM))
	r := work(mainM)
	r.Deadline = h.clk.Now().Add(5 * time.Second)
	q := h.queued(r) // 5s left: it can finish in 3s once it starts
	h.clk.Advance(4 * time.Second)
	p.Abandon() // the slot frees with 1s left: q cannot finish in 3s and is dropped
	h.drain()
	err := h.take(q).err
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)

	// A repeat at once finds the class idle and is admitted: the deadline
	// was not lost.
	again := r
	repeat := h.admitted(again)
	repeat.Abandon()
	h.drain()

	require.False(t, o.Final(), "a drop before the deadline passed is final although a repeat was admitted: %v", err)
	ra, ok := status.RetryAfter(err)
	require.True(t, ok && ra > 0, "a repeatable refusal suggests no delay: %v", err)
}

// Review 13 read LendIdle's doc ("lets requests of other classes run on
// this class's idle slots when none of its own requests wait") as leaving
// open what happens when the lender's own request arrives while a borrower
// holds its slot. Nothing is preempted: the lender's request waits until
// the borrower ends, however long it lives (a stream, for its lifetime),
// and meanwhile the lender lends to no one else. The doc now says so; this pins it.
func TestLendersOwnRequestWaitsForItsBorrowerToEnd(t *testing.T) {
	h := newHarness(t, lendAndBorrowOptions(2)...)
	b1 := h.admitted(streamOn(bM)) // on b's own slot
	h.override(admission.Override{Actor: "test", Reason: "review13", TTL: time.Hour, Class: "opt", Freeze: true})
	borrowed := h.admitted(streamOn(bM))                  // opt frozen: it borrows the lender's idle slot
	own := h.queued(work(lenderM))                        // the lender's own request waits for it
	h.refused(streamOn(bM), status.ReasonConcurrencyFull) // the lender has a waiter: no loan
	h.clk.Advance(time.Minute)
	_, started := h.done[own]
	require.False(t, started, "the borrower was preempted")
	borrowed.Abandon()
	h.drain()
	r := h.take(own)
	require.NoError(t, r.err, "the lender's slot went to its own waiter")
	r.permit.Release()
	b1.Abandon()
	h.drain()
}

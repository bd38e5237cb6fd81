package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). DESIGN.md
// §3.6: refusals are allocation-light. The play-out (playOutLocked) counted
// the slots no request holds as free now by prepending that many zeros to
// its ends in a fresh slice: a refusal made with a slot free — the deadline
// stage's DEADLINE_UNREACHABLE for a request that cannot finish even
// without waiting, whose retry-after asks the predicted wait — allocated
// that slice whenever a stream held one of the class's slots, and the same
// refusal beside a unary call did not.
func TestPlayOutFreeSlotsRefusalAllocatesNoMoreThanUnary(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	allocs := func(stream bool) float64 {
		ctrl, err := admission.New(admission.WithClock(func() time.Time { return t0 }),
			admission.WithClasses(admission.Class{Name: "work", Slots: 8, QueueItems: 4, ExpectedServiceTime: 10 * time.Millisecond}),
			admission.WithDefaultClass("work"))
		require.NoError(t, err)
		defer func() { _ = ctrl.Close() }()
		ctx := context.Background()
		p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Size: -1, Stream: stream}, t0)
		require.NoError(t, err)
		defer p.Abandon()
		// 5 ms left for 10 ms of work: refused with seven slots free.
		r := admission.Request{Method: "/s.S/Get", Size: 1, Deadline: t0.Add(5 * time.Millisecond)}
		return testing.AllocsPerRun(200, func() {
			_, err := ctrl.AdmitAt(ctx, r, t0)
			if status.OutcomeOf(err).Reason != status.ReasonDeadlineUnreachable {
				t.Fatalf("want DEADLINE_UNREACHABLE, got %v", err)
			}
		})
	}
	unary, stream := allocs(false), allocs(true)
	t.Logf("allocations per refusal with slots free: beside a unary call %v, beside a stream %v", unary, stream)
	require.LessOrEqual(t, stream, unary, "a refusal with slots free beside a stream allocates the play-out's padded slice")
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). Since a
// stream's end is guessed only while streams hold every slot, a stream
// with a deadline frees its slot in the play-out at that deadline, however
// far: one centuries away is ≈2^63 ns from the epoch (time.Time.Sub
// saturates), and the play-out's float wait, converted to a
// time.Duration, overflowed to a negative wait (float→int64 beyond range).
// Two slots, tenants limited to one running request: t runs a unary call
// (1s) and has one waiting, so its slot serves its own waiter; a runs a
// stream due in the year 2500. The class predicted a negative wait, and b's
// request due in 1.5s — which starts at 2s at the soonest, once t's unary
// call and its waiter have run — was queued rather than refused
// DEADLINE_UNREACHABLE.
func TestFarStreamDeadlineDoesNotOverflowThePredictedWait(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "main", Slots: 2, QueueItems: 4,
		TenantRunning: 1, ExpectedServiceTime: time.Second}))
	u := work(mainM)
	u.Tenant = "t"
	up := h.admitted(u)
	tw := h.queued(u) // held by t's running limit
	s := streamOn(mainM)
	s.Tenant = "a"
	s.Deadline = time.Date(2500, 1, 1, 0, 0, 0, 0, time.UTC)
	stream := h.admitted(s)

	st, _ := h.ctrl.Stats().Class("main")
	require.Positive(t, st.PredictedWait, "the predicted wait overflowed time.Duration")

	r := work(mainM)
	r.Tenant = "b"
	r.Deadline = h.clk.Now().Add(1500 * time.Millisecond)
	h.refusedUnreachable(r, "queued on a negative (overflowed) predicted wait")

	h.waiterStartsAt1s(up, tw, stream)
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). A waiter of an
// optional class that ran out of time while Recovering's step held its
// class is the step's doing, not load (dropWaiterCounted leaves such a drop
// out of the window even when the step has ended by the time it is made).
// Since 800c3c5 the pump that the windows' close runs inside ctxEnded no
// longer drops the leaving waiter, and ctxEnded counted its
// DEADLINE_EXPIRED (its caller's deadline passed while it waited) as
// overload whenever the step had just ended: in that very roll (the window
// ending at 4s turns Recovering into Normal), the first Normal window held
// one overload refusal, and the controller went straight back to Degraded,
// where the pump's drop a moment earlier had counted nothing.
func TestLeavingWaiterExpiredUnderTheStepCountsNoOverload(t *testing.T) {
	// Window 1: main overloaded → Degraded; window 2 healthy → Recovering;
	// window 3 healthy: the step grows to 2 slots.
	h := steppedOptHarness(t, 1)
	a1 := h.admitted(h.optDue(time.Minute))
	defer a1.Abandon()
	a2 := h.admitted(h.optDue(time.Minute))
	defer a2.Abandon()
	// b, within the class's 3 configured slots, waits behind the step's 2
	// and runs out of time at 3.5s; its caller's deadline has passed when
	// it leaves at 4s, as the window ending then closes (Normal).
	b := h.queued(h.optDue(500 * time.Millisecond))
	h.clk.Advance(time.Second)
	res := h.cancel(b)
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(res.err).Reason, "%v", res.err)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("mode %v, want NORMAL", m)
	}
	// Window 5: nothing arrives, main idle.
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("first Normal window, main idle, no new load: mode %v, want NORMAL (the expiry Recovering's step caused counted as overload)", m)
	}
}

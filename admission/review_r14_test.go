package admission_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). The play-out
// of the slots (playOutLocked), used while a stream holds a slot of the
// class, expected every stream to end after a guessed lifetime — as long
// again as it had lived, at least the class's mean — even a stream with no
// deadline, which nothing ends, in a class whose other slots free as their
// unary calls end. Two slots: a stream without a deadline and a unary call
// of 1s; one request (1s) waits. The waiter starts on the unary call's slot
// at 1s, and the next request at 2s, when the waiter ends; the play-out put
// the next one on the stream's slot at its made-up end, 1s, and a request
// due in 2.5s, which could finish no sooner than 3s, was queued.
func TestDeadlineLessStreamFreesNoSlotInThePlayOut(t *testing.T) {
	h := newHarness(t, mainOf1s(2))
	stream := h.admitted(streamOn(mainM)) // no deadline: holds its slot until its client ends it
	u := h.admitted(work(mainM))
	waiter := h.queued(work(mainM))

	st, _ := h.ctrl.Stats().Class("main")
	require.Equal(t, 2*time.Second, st.PredictedWait,
		"the next start is when the waiter, started on the unary call's slot at 1s, ends; not at the stream's guessed end")

	r := work(mainM)
	r.Deadline = h.clk.Now().Add(2500 * time.Millisecond)
	h.refusedUnreachable(r,
		"queued on the stream's made-up end at 1s; it starts at 2s at the soonest and cannot finish by 2.5s")

	h.waiterStartsAt1s(u, waiter, stream, "the waiter starts on the unary call's slot at 1s")
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). A stream with
// a deadline an hour away, beside a slot that a unary call frees, was
// expected to end after its guessed lifetime (the class's mean, 1s) rather
// than at its deadline, where its handler's context ends: the guess stands
// only when streams hold every slot, so that nothing else could free one.
func TestStreamWithAFarDeadlineFreesItsSlotAtItsDeadlineInThePlayOut(t *testing.T) {
	h := newHarness(t, mainOf1s(2))
	s := streamOn(mainM)
	s.Deadline = h.clk.Now().Add(time.Hour)
	stream := h.admitted(s)
	u := h.admitted(work(mainM))
	waiter := h.queued(work(mainM))

	st, _ := h.ctrl.Stats().Class("main")
	require.Equal(t, 2*time.Second, st.PredictedWait,
		"the next start is when the waiter, started on the unary call's slot at 1s, ends; the stream ends in an hour")

	h.waiterStartsAt1s(u, waiter, stream)
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). A tenant's own
// next start (tenantStartWaitLocked) was played out on its running
// requests' ends with a stream without a deadline expected to end after its
// guessed lifetime: tenant t (limit 2) runs such a stream and a unary call
// of 1s, and has a request (1s) waiting; t's next request starts when that
// one, started on the unary call's slot at 1s, ends at 2s, but was
// predicted to start at 1s on the stream's made-up end, and one due in
// 2.5s was queued.
func TestTenantsDeadlineLessStreamFreesNoSlotInItsStartWait(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "main", Slots: 4, QueueItems: 4,
		TenantRunning: 2, ExpectedServiceTime: time.Second}))
	s := streamOn(mainM)
	s.Tenant = "t"
	stream := h.admitted(s)
	r := work(mainM)
	r.Tenant = "t"
	u := h.admitted(r)
	waiter := h.queued(r) // held by t's running limit; the class has slots free

	late := r
	late.Deadline = h.clk.Now().Add(2500 * time.Millisecond)
	h.refusedUnreachable(late,
		"queued on the stream's made-up end at 1s; t's next start is at 2s, too late to finish by 2.5s")

	h.waiterStartsAt1s(u, waiter, stream)
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). A waiter whose
// context ended (its caller left) while its class's degradation window
// closed was dropped DEADLINE_EXPIRED by the pump that the window's close
// runs in ctxEnded (advance), when it could no longer finish by its
// deadline at the instant its leaving was handled: counted as the queue's
// give-up (a refusal, an overload signal) though its caller had gone
// first, rather than as a cancelled request. The leaving waiter is its
// caller's: the pump neither starts it nor drops it.
func TestLeavingWaiterIsNotDroppedAsExpiredByTheWindowsPump(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 2, ExpectedServiceTime: time.Second}),
		admission.WithDegradation(admission.Degradation{Window: time.Second}))
	running := h.admitted(work(mainM))
	r := work(mainM)
	r.Deadline = h.clk.Now().Add(3 * time.Second)
	w := h.queued(r) // starts at 1s, finishes at 2s

	// At 2.5s it could no longer finish by 3s; its caller leaves then, and
	// the windows that ended at 1s and 2s close as ctxEnded handles it.
	h.clk.Advance(2500 * time.Millisecond)
	res := h.cancel(w)
	require.Error(t, res.err)
	require.True(t, errors.Is(res.err, context.Canceled), "%v", res.err)
	require.Equal(t, status.ReasonUnspecified, status.OutcomeOf(res.err).Reason,
		"the caller left: no refusal of the controller's (%v)", res.err)
	st, _ := h.ctrl.Stats().Class("main")
	require.Equal(t, uint64(1), st.Cancelled)
	require.Zero(t, st.Refused["DEADLINE_EXPIRED"])
	running.Release()
	h.drain()
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). A waiter's
// give-up timer (wait, real clock: it drops a waiter that can no longer
// finish by its deadline) did not look at the waiter's context: when the
// context had ended (the caller cancelled) by the time the timer's path
// took the lock, the waiter was dropped DEADLINE_EXPIRED — counted as the
// queue's refusal, an overload signal — instead of going ctxEnded's way,
// as a cancelled request. The timer runs on the real clock only (WithClock
// arms none), so the test orders the events by the goroutine's state
// rather than by time: the timer fires while the controller's lock is held
// (inside an invariant check, which runs under it), the waiter blocks on
// the lock, and the caller cancels before the lock is released.
func TestGiveUpTimerLeavesACancelledWaiterToCtxEnded(t *testing.T) {
	var armed, timed atomic.Bool
	var mu sync.Mutex
	var viol []error
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 2, ExpectedServiceTime: 200 * time.Millisecond}),
		admission.WithDefaultClass("work"),
		admission.WithStages(admission.AllStages&^admission.StageDegradation),
		admission.WithInvariantCheck(func(err error) {
			// Under the controller's lock.
			if err != nil {
				mu.Lock()
				viol = append(viol, err)
				mu.Unlock()
			}
			if armed.CompareAndSwap(true, false) {
				// The timer fires (at the deadline less 200ms) and the
				// waiter blocks on the lock held here.
				timed.Store(waiterIn(t, "sync.Mutex.Lock", 10*time.Second))
				cancel()
			}
		}))
	require.NoError(t, err)
	defer func() { require.NoError(t, ctrl.Close()) }()
	held, err := ctrl.Admit(context.Background(), admission.Request{Method: "/w.W/Do", Size: -1})
	require.NoError(t, err)
	defer held.Release()

	type outcome struct {
		p   *admission.Permit
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		p, err := ctrl.Admit(ctx, admission.Request{Method: "/w.W/Do", Size: -1, Deadline: time.Now().Add(time.Second)})
		done <- outcome{p, err}
	}()
	require.True(t, waiterIn(t, "select", 10*time.Second), "the waiter never waited")
	armed.Store(true)
	ctrl.Stats() // its invariant check holds the lock until the timer fired
	require.True(t, timed.Load(), "the give-up timer did not fire")

	o := <-done
	require.Nil(t, o.p)
	require.True(t, errors.Is(o.err, context.Canceled), "%v", o.err)
	require.Equal(t, status.ReasonUnspecified, status.OutcomeOf(o.err).Reason,
		"a waiter whose caller had cancelled was given up by its timer: %v", o.err)
	st, _ := ctrl.Stats().Class("work")
	require.Equal(t, uint64(1), st.Cancelled)
	require.Zero(t, st.Refused["DEADLINE_EXPIRED"])
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, viol)
}

// waiterIn reports whether, within limit, a goroutine waits inside the
// controller's wait in the given state ("select", "sync.Mutex.Lock").
func waiterIn(t *testing.T, state string, limit time.Duration) bool {
	t.Helper()
	buf := make([]byte, 1<<20)
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(time.Millisecond) {
		n := runtime.Stack(buf, true)
		for g := range strings.SplitSeq(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "admission.(*Controller).wait(") && strings.Contains(g, " ["+state) {
				return true
			}
		}
	}
	return false
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). The play-out
// counted only the slots that running requests hold: a class of two slots
// with one stream on one (no deadline, an hour old) and the other free
// predicted (Stats.PredictedWait, and the retry-afters built on it) an
// hour's wait — the stream's guessed end — for a request that would start
// at once on the free slot. A slot no request holds frees now.
func TestPlayOutCountsAFreeSlotAsFreeNow(t *testing.T) {
	h := newHarness(t, mainOf1s(2))
	stream := h.admitted(streamOn(mainM))
	h.clk.Advance(time.Hour)

	st, _ := h.ctrl.Stats().Class("main")
	require.Equal(t, 1, st.UsedSlots)
	require.Zero(t, st.PredictedWait, "a slot is free, yet the wait predicted is the stream's guessed end")
	p := h.admitted(work(mainM)) // it starts at once
	p.Release()
	stream.Abandon()
	h.drain()
}

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

// A review found that a DEADLINE_EXPIRED refusal was final when the dequeue
// stage dropped a waiter, but not when the waiter's context ended after the
// request's deadline had passed (ctxEnded), nor when it had ended before
// Admit looked: the same fact — the request's deadline passed while it had
// not started — told a caller once "no repeat can help" and once "repeat".
// A deadline that has passed cannot be met by any repeat within the
// attempt (DESIGN.md §1 "final", §2.5): those refusals are final, and
// carry no delay. A context that ended by a deadline of its own before the
// request's (a per-try timeout) leaves the request's deadline to a repeat:
// that refusal is not final, and suggests a delay that reflects the queue,
// as every repeatable refusal does (§3.6).
func TestDeadlineExpiredIsFinalExactlyWhenTheRequestsDeadlinePassed(t *testing.T) {
	cls := admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond})
	requireFinal := func(t *testing.T, err error, final bool) {
		t.Helper()
		o := status.OutcomeOf(err)
		require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
		require.Equal(t, final, o.Final(), "%v", err)
		ra, ok := status.RetryAfter(err)
		if final {
			require.False(t, ok && ra > 0, "a final refusal suggests a delay: %v", ra)
		} else {
			require.True(t, ok && ra > 0, "a repeatable refusal suggests no delay")
		}
	}

	// queuedPastItsDeadline queues a request with 500ms left behind one
	// that holds the only slot (p) and lets 600ms pass: q's deadline has
	// passed while it waits.
	queuedPastItsDeadline := func(t *testing.T) (h *harness, p *admission.Permit, q int) {
		h = newHarness(t, cls)
		p = h.admitted(work(mainM))
		r := work(mainM)
		r.Deadline = h.clk.Now().Add(500 * time.Millisecond)
		q = h.queued(r)
		h.clk.Advance(600 * time.Millisecond)
		return h, p, q
	}

	t.Run("dequeue drop", func(t *testing.T) {
		h, p, q := queuedPastItsDeadline(t)
		h.release(p) // the slot frees: q is dropped unrun
		requireFinal(t, h.take(q).err, true)
	})
	t.Run("context canceled after the request's deadline", func(t *testing.T) {
		h, p, q := queuedPastItsDeadline(t)
		res := h.cancel(q) // an RST_STREAM at the client's deadline
		require.True(t, errors.Is(res.err, context.Canceled))
		requireFinal(t, res.err, true)
		h.release(p)
	})
	t.Run("context ended before Admit looked, after the request's deadline", func(t *testing.T) {
		h := newHarness(t, cls)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r := work(mainM)
		r.Deadline = h.clk.Now().Add(-time.Millisecond)
		id, _ := h.arriveCtx(ctx, cancel, r)
		requireFinal(t, h.take(id).err, true)
	})
	t.Run("a per-try deadline before the request's", func(t *testing.T) {
		h := newHarness(t, cls)
		p := h.admitted(work(mainM))
		r := work(mainM)
		r.Deadline = h.clk.Now().Add(10 * time.Second)
		ctx, cancel := context.WithCancelCause(context.Background())
		q, _ := h.arriveCtx(ctx, func() { cancel(context.DeadlineExceeded) }, r)
		h.clk.Advance(600 * time.Millisecond)
		res := h.cancel(q)
		requireFinal(t, res.err, false)
		h.release(p)
	})
}

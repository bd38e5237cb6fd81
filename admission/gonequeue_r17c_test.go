package admission_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

// r17cRig drives one class whose first waiter of tenant gone is held, its
// own goroutine stuck in the observer that receives its EventQueued, so
// that only other calls can find it once its context ends. Each request's
// outcome is told by its result or its EventQueued, whichever comes: no
// sleeps.
type r17cRig struct {
	t       *testing.T
	ctrl    *admission.Controller
	clk     *clock
	virtual bool
	proceed chan struct{} // lets the gone waiter's goroutine on
	noted   chan struct{} // a waiter's context's ending was noted (WithGoneNoted)
	mu      sync.Mutex
	queued  map[string]chan struct{}
	wg      sync.WaitGroup
}

type r17cRes struct {
	p   *admission.Permit
	err error
}

func newR17cRig(t *testing.T, virtual bool, cl admission.Class, opts ...admission.Option) *r17cRig {
	t.Helper()
	r := &r17cRig{t: t, clk: newClock(), virtual: virtual, proceed: make(chan struct{}),
		noted: make(chan struct{}, 16), queued: map[string]chan struct{}{}}
	blocked := false
	opts = append(opts, admission.WithClock(r.clk.Now),
		admission.WithGoneNoted(func() { r.noted <- struct{}{} }),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind != admission.EventQueued {
				return
			}
			r.mu.Lock()
			ch := r.queued[e.Tenant]
			first := e.Tenant == "gone" && !blocked
			blocked = blocked || first
			r.mu.Unlock()
			if ch != nil {
				close(ch)
			}
			if first {
				<-r.proceed
			}
		}),
		admission.WithClasses(cl))
	ctrl, err := admission.New(opts...)
	require.NoError(t, err)
	r.ctrl = ctrl
	t.Cleanup(func() {
		select {
		case <-r.proceed:
		default:
			close(r.proceed)
		}
		require.NoError(t, ctrl.Close())
		r.wg.Wait()
	})
	return r
}

// admit sends a request of tenant; it returns the result channel and
// whether the request joined the queue (false: it was decided at once,
// and its result is in the channel).
func (r *r17cRig) admit(ctx context.Context, tenant string, deadline time.Time) (chan r17cRes, bool) {
	q := make(chan struct{})
	r.mu.Lock()
	r.queued[tenant] = q
	r.mu.Unlock()
	out := make(chan r17cRes, 1)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		req := admission.Request{Method: "/r17c.S/Do", Tenant: tenant, Size: -1, Deadline: deadline}
		var p *admission.Permit
		var err error
		if r.virtual {
			p, err = r.ctrl.AdmitAt(ctx, req, r.clk.Now())
		} else {
			p, err = r.ctrl.Admit(ctx, req)
		}
		out <- r17cRes{p, err}
	}()
	select {
	case <-q:
		return out, true
	case res := <-out:
		out <- res
		return out, false
	}
}

// refusedErr is the error of a request decided at once (admit's false),
// nil for one still waiting; it leaves the result in out.
func refusedErr(out chan r17cRes) error {
	select {
	case res := <-out:
		out <- res
		return res.err
	default:
		return nil
	}
}

// running admits tenant's request, which must get a slot at once.
func (r *r17cRig) running(tenant string) *admission.Permit {
	out, queued := r.admit(context.Background(), tenant, time.Time{})
	require.False(r.t, queued, tenant)
	res := <-out
	require.NoError(r.t, res.err, tenant)
	return res.p
}

func (r *r17cRig) release(p *admission.Permit) {
	if r.virtual {
		p.ReleaseAt(r.clk.Now())
	} else {
		p.Release()
	}
}

func (r *r17cRig) stats() admission.ClassStats {
	var s admission.Stats
	if r.virtual {
		s = r.ctrl.StatsAt(r.clk.Now())
	} else {
		s = r.ctrl.Stats()
	}
	cs, ok := s.Class("a")
	require.True(r.t, ok)
	return cs
}

// goneOnce ends ctx with end and, on the test clock (Admit), waits until
// the controller has noted it: the gone waiter's own goroutine is still
// held in the observer, so only another call can take it out. On a virtual
// clock (AdmitAt) nothing is waited for: the next call looks at the
// waiters' contexts itself. (The bound is a watchdog, not a measure: the
// note comes at once, or never.)
func (r *r17cRig) goneOnce(end func()) {
	end()
	if r.virtual {
		return
	}
	watchdog := time.NewTimer(10 * time.Second)
	defer watchdog.Stop()
	select {
	case <-r.noted:
	case <-watchdog.C:
		r.t.Fatal("the controller never noted that the waiter's context ended")
	}
}

// r17cEnd is how the gone waiter's context ends, and how it is counted.
type r17cEnd struct {
	name   string
	ctx    func() (context.Context, func())
	reason status.Reason // UNSPECIFIED: cancelled
}

var r17cEnds = []r17cEnd{
	{"canceled", func() (context.Context, func()) {
		ctx, cancel := context.WithCancel(context.Background())
		return ctx, cancel
	}, status.ReasonUnspecified},
	{"deadline", func() (context.Context, func()) {
		ctx, cancel := context.WithCancelCause(context.Background())
		return ctx, func() { cancel(context.DeadlineExceeded) }
	}, status.ReasonDeadlineExpired},
}

func r17cClock(virtual bool) string {
	if virtual {
		return "virtual"
	}
	return "test clock"
}

// requireCounts checks the class's decisions: admitted, cancelled and the
// refusals by reason, exactly.
func requireCounts(t *testing.T, s admission.ClassStats, admitted, cancelled uint64, refused map[string]uint64) {
	t.Helper()
	require.Equal(t, admitted, s.Admitted, "admitted")
	require.Equal(t, cancelled, s.Cancelled, "cancelled")
	got := map[string]uint64{}
	for k, n := range s.Refused {
		if n != 0 {
			got[k] = n
		}
	}
	if refused == nil {
		refused = map[string]uint64{}
	}
	require.Equal(t, refused, got, "refused")
}

// goneCounts is what the gone waiter adds to the counts: cancelled, or a
// DEADLINE_EXPIRED refusal.
func goneCounts(end r17cEnd, refused map[string]uint64) (cancelled uint64, all map[string]uint64) {
	all = map[string]uint64{}
	for k, n := range refused {
		all[k] = n
	}
	if end.reason == status.ReasonUnspecified {
		return 1, all
	}
	all[status.ReasonName(end.reason)]++
	return 0, all
}

func requireGoneResult(t *testing.T, end r17cEnd, res r17cRes) {
	t.Helper()
	require.Nil(t, res.p, "no slot for a caller that has gone")
	require.True(t, errors.Is(res.err, context.Canceled), "its context's error: %v", res.err)
	require.Equal(t, end.reason, status.OutcomeOf(res.err).Reason, "as its context's ending says: %v", res.err)
}

// A waiter whose caller has gone, standing at the head of a full queue with
// no slot free, held a place until its own goroutine took it out: a live
// arrival was refused QUEUE_FULL for it. Now the arrival takes it out first
// (counted once, as its context's ending says), queues, and only an
// arrival that finds the queue full of live waiters is refused QUEUE_FULL.
func TestR17cGoneWaiterAtTheHeadHoldsNoPlace(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		for _, end := range r17cEnds {
			t.Run(r17cClock(virtual)+"/"+end.name, func(t *testing.T) {
				r := newR17cRig(t, virtual, admission.Class{Name: "a", Slots: 1, QueueItems: 2, ExpectedServiceTime: 100 * time.Millisecond})
				held := r.running("held")
				ctx, cancel := end.ctx()
				defer cancel()
				gone, queued := r.admit(ctx, "gone", time.Time{})
				require.True(t, queued)
				l1, queued := r.admit(context.Background(), "l1", time.Time{})
				require.True(t, queued)
				r.goneOnce(cancel)

				l2, queued := r.admit(context.Background(), "l2", time.Time{})
				require.True(t, queued, "refused for a waiter that has gone: %v", refusedErr(l2))
				l3, queued := r.admit(context.Background(), "l3", time.Time{})
				require.False(t, queued, "the queue holds two live waiters")
				res := <-l3
				require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(res.err).Reason, "%v", res.err)

				s := r.stats()
				require.Equal(t, 2, s.Queued, "the live waiters")
				cancelled, refused := goneCounts(end, map[string]uint64{"QUEUE_FULL": 1})
				requireCounts(t, s, 1, cancelled, refused)

				close(r.proceed)
				requireGoneResult(t, end, <-gone)
				r.release(held)
				for _, l := range []chan r17cRes{l1, l2} {
					res := <-l
					require.NoError(t, res.err)
					r.release(res.p)
				}
				s = r.stats()
				require.Zero(t, s.Queued)
				requireCounts(t, s, 3, cancelled, refused)
			})
		}
	}
}

// A waiter whose caller has gone, held by its tenant's running limit, held
// a place in the queue and in its tenant's queue limit until its own
// goroutine took it out: its tenant's next request was refused
// TENANT_LIMIT and another tenant's QUEUE_FULL. Now each arrival takes it
// out first, counted once.
func TestR17cGoneWaiterHeldByItsTenantHoldsNoPlace(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		for _, end := range r17cEnds {
			t.Run(r17cClock(virtual)+"/"+end.name, func(t *testing.T) {
				r := newR17cRig(t, virtual, admission.Class{Name: "a", Slots: 2, QueueItems: 3, TenantRunning: 1, TenantQueued: 1, ExpectedServiceTime: 100 * time.Millisecond})
				heldGone := r.running("gone") // its tenant at its running limit
				heldU := r.running("u")       // the class full
				ctx, cancel := end.ctx()
				defer cancel()
				gone, queued := r.admit(ctx, "gone", time.Time{})
				require.True(t, queued)
				l1, queued := r.admit(context.Background(), "l1", time.Time{})
				require.True(t, queued)
				r.goneOnce(cancel)

				// Its tenant's next request: the tenant has no live waiter.
				again, queued := r.admit(context.Background(), "gone", time.Time{})
				require.True(t, queued, "refused for its tenant's waiter that has gone: %v", refusedErr(again))
				l2, queued := r.admit(context.Background(), "l2", time.Time{})
				require.True(t, queued, "refused for a waiter that has gone: %v", refusedErr(l2))
				l3, queued := r.admit(context.Background(), "l3", time.Time{})
				require.False(t, queued, "the queue holds three live waiters")
				res := <-l3
				require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(res.err).Reason, "%v", res.err)

				s := r.stats()
				require.Equal(t, 3, s.Queued, "the live waiters")
				require.Equal(t, admission.TenantStats{Running: 1, Queued: 1, QueuedWork: 100 * time.Millisecond}, s.Tenants["gone"])
				cancelled, refused := goneCounts(end, map[string]uint64{"QUEUE_FULL": 1})
				requireCounts(t, s, 2, cancelled, refused)

				close(r.proceed)
				requireGoneResult(t, end, <-gone)
				r.release(heldU) // l1 starts (the gone tenant's waiter is held)
				res = <-l1
				require.NoError(t, res.err)
				r.release(res.p) // l2 starts
				res = <-l2
				require.NoError(t, res.err)
				r.release(heldGone) // its tenant's live request starts
				res = <-again
				require.NoError(t, res.err)
				r.release(res.p)
				s = r.stats()
				require.Zero(t, s.Queued)
				requireCounts(t, s, 5, cancelled, refused)
			})
		}
	}
}

// Stats takes a waiter whose caller has gone out before it counts the
// queue, wherever it stands (here behind a live waiter, with no slot
// free), counted once.
func TestR17cStatsTakesGoneWaitersOut(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		for _, end := range r17cEnds {
			t.Run(r17cClock(virtual)+"/"+end.name, func(t *testing.T) {
				r := newR17cRig(t, virtual, admission.Class{Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond})
				held := r.running("held")
				l1, queued := r.admit(context.Background(), "l1", time.Time{})
				require.True(t, queued)
				ctx, cancel := end.ctx()
				defer cancel()
				gone, queued := r.admit(ctx, "gone", time.Time{})
				require.True(t, queued)
				r.goneOnce(cancel)

				s := r.stats()
				require.Equal(t, 1, s.Queued, "the live waiter only")
				require.Equal(t, 100*time.Millisecond, s.QueuedWork)
				cancelled, refused := goneCounts(end, nil)
				requireCounts(t, s, 1, cancelled, refused)

				close(r.proceed)
				requireGoneResult(t, end, <-gone)
				r.release(held)
				res := <-l1
				require.NoError(t, res.err)
				r.release(res.p)
				requireCounts(t, r.stats(), 2, cancelled, refused)
			})
		}
	}
}

// On a virtual clock, a waiter whose caller went away at one time and a
// call far ahead that found it still queued (its goroutine not yet run)
// judged it at the call's time: the windows that closed in between saw it
// wait past MaxQueueAge (Degraded), and a request deadline passed in the
// gap made it DEADLINE_EXPIRED. It is now judged at the time its context
// ended — the latest time the controller had been given — before any
// window closes: cancelled, its wait that short.
func TestR17cVirtualGoneWaiterJudgedWhenItsContextEnded(t *testing.T) {
	for _, withDeadline := range []bool{false, true} {
		name := "no deadline"
		if withDeadline {
			name = "deadline in the gap"
		}
		t.Run(name, func(t *testing.T) {
			r := newR17cRig(t, true, admission.Class{Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: 10 * time.Millisecond},
				admission.WithDegradation(admission.Degradation{Window: 100 * time.Millisecond, MaxQueueAge: 50 * time.Millisecond, MaxRefusalRatio: -1}))
			held := r.running("held")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var deadline time.Time
			if withDeadline {
				deadline = r.clk.Now().Add(time.Second)
			}
			gone, queued := r.admit(ctx, "gone", deadline)
			require.True(t, queued)
			cancel() // at the controller's time epoch: it has been given no later one

			far := r.clk.Advance(10 * time.Second)
			require.Equal(t, admission.ModeNormal, r.ctrl.ModeAt(far), "no window saw the gone waiter wait")
			s := r.stats()
			require.Zero(t, s.Queued)
			requireCounts(t, s, 1, 1, nil)
			st := r.ctrl.StatsAt(far)
			require.Zero(t, st.Transitions, "the mode never moved")

			close(r.proceed)
			requireGoneResult(t, r17cEnds[0], <-gone)
			r.release(held)
		})
	}
}

// The tap, which refuses without the lock while its class is flagged full,
// lets a request through to Admit once the context of a waiter of the full
// queue has ended (noted by the controller), since Admit takes that waiter
// out before it judges the queue: the request queues in its place.
func TestR17cTapLetsThroughWhileAGoneWaiterHoldsAPlace(t *testing.T) {
	r := newR17cRig(t, false, admission.Class{Name: "a", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond})
	held := r.running("held")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gone, queued := r.admit(ctx, "gone", time.Time{})
	require.True(t, queued)
	info := &tap.Info{FullMethodName: "/r17c.S/Do"}
	_, err := r.ctrl.TapHandle(context.Background(), info)
	require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(err).Reason, "full with a live waiter: %v", err)
	r.goneOnce(cancel)

	_, err = r.ctrl.TapHandle(context.Background(), info)
	require.NoError(t, err, "a waiter of the full queue has gone")
	l1, queued := r.admit(context.Background(), "l1", time.Time{})
	require.True(t, queued, "refused for a waiter that has gone: %v", refusedErr(l1))
	_, err = r.ctrl.TapHandle(context.Background(), info)
	require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(err).Reason, "full again, with a live waiter: %v", err)

	close(r.proceed)
	requireGoneResult(t, r17cEnds[0], <-gone)
	r.release(held)
	res := <-l1
	require.NoError(t, res.err)
	r.release(res.p)
	requireCounts(t, r.stats(), 2, 1, map[string]uint64{"QUEUE_FULL": 2})
}

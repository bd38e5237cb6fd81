package admission_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

// r17gLenderRig has a borrowing class a and a lending class b whose one
// waiter, of tenant "gone", is held by its tenant's running limit while b
// has an idle slot: b lends nothing while that waiter stands in its queue.
// The waiter's own goroutine is held in the observer that receives its
// EventQueued, so that only another call can take it out once its context
// ends (the controller notes the ending: WithGoneNoted).
type r17gLenderRig struct {
	ctrl    *admission.Controller
	proceed chan struct{}
	noted   chan struct{}
	queued  chan string
	wg      sync.WaitGroup
}

type r17gRes struct {
	p   *admission.Permit
	err error
}

func newR17gLenderRig(t *testing.T, a admission.Class) *r17gLenderRig {
	t.Helper()
	r := &r17gLenderRig{proceed: make(chan struct{}), noted: make(chan struct{}, 4), queued: make(chan string, 8)}
	clk := newClock()
	var once sync.Once
	ctrl, err := admission.New(
		admission.WithClock(clk.Now),
		admission.WithClasses(a,
			admission.Class{Name: "b", Slots: 2, QueueItems: 2, LendIdle: true, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithMethods("a", "/r17g.A/"),
		admission.WithMethods("b", "/r17g.B/"),
		admission.WithInvariantCheck(func(err error) {
			if err != nil {
				t.Errorf("invariant: %v", err)
			}
		}),
		admission.WithGoneNoted(func() { r.noted <- struct{}{} }),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind != admission.EventQueued {
				return
			}
			r.queued <- e.Tenant
			if e.Tenant == "gone" {
				once.Do(func() { <-r.proceed })
			}
		}))
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

// admit sends a request of tenant to method in the background.
func (r *r17gLenderRig) admit(ctx context.Context, method, tenant string) chan r17gRes {
	out := make(chan r17gRes, 1)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		p, err := r.ctrl.Admit(ctx, admission.Request{Method: method, Tenant: tenant, Size: -1})
		out <- r17gRes{p, err}
	}()
	return out
}

func (r *r17gLenderRig) mustRun(t *testing.T, method, tenant string) *admission.Permit {
	t.Helper()
	res := <-r.admit(context.Background(), method, tenant)
	require.NoError(t, res.err, tenant)
	return res.p
}

func (r *r17gLenderRig) mustQueue(t *testing.T, ctx context.Context, method, tenant string) chan r17gRes {
	t.Helper()
	out := r.admit(ctx, method, tenant)
	select {
	case got := <-r.queued:
		require.Equal(t, tenant, got)
	case res := <-out:
		t.Fatalf("%s decided at once, not queued: %v", tenant, res.err)
	}
	return out
}

// A waiter whose caller has gone in a lending class keeps that class from
// lending its idle slot, and so keeps a borrowing class full, until a call
// takes it out. Admit does so before it judges the borrowing class (the
// borrower's head starts on the lent slot, and the arrival queues), so the
// tap, which promises to let requests through to Admit while a waiter
// whose caller has gone holds a place, must let the borrower's arrival
// through as well: it refused it QUEUE_FULL, or CONCURRENCY_FULL for a
// borrower without a queue, looking only at the borrower's own waiters.
func TestR17gTapLetsThroughWhileAGoneWaiterBlocksALender(t *testing.T) {
	for _, tc := range []struct {
		name   string
		a      admission.Class
		reason status.Reason
	}{
		{"queue full", admission.Class{Name: "a", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond}, status.ReasonQueueFull},
		{"no queue", admission.Class{Name: "a", Slots: 1, ExpectedServiceTime: 100 * time.Millisecond}, status.ReasonConcurrencyFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newR17gLenderRig(t, tc.a)
			bx := r.mustRun(t, "/r17g.B/Do", "gone") // its tenant at its running limit in b; b has one idle slot
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			gone := r.mustQueue(t, ctx, "/r17g.B/Do", "gone") // held by its tenant: b lends nothing now
			a1 := r.mustRun(t, "/r17g.A/Do", "a1")
			var a2 chan r17gRes
			if tc.a.QueueItems > 0 {
				a2 = r.mustQueue(t, context.Background(), "/r17g.A/Do", "a2")
			}
			info := &tap.Info{FullMethodName: "/r17g.A/Do"}
			_, err := r.ctrl.TapHandle(context.Background(), info)
			require.Equal(t, tc.reason, status.OutcomeOf(err).Reason, "a is full while b's live waiter blocks its lending: %v", err)

			cancel()
			select {
			case <-r.noted:
			case <-time.After(10 * time.Second): // a watchdog: the note comes at once, or never
				t.Fatal("the controller never noted that the waiter's context ended")
			}

			_, err = r.ctrl.TapHandle(context.Background(), info)
			require.NoError(t, err, "b's waiter has gone: Admit takes it out, and b lends its idle slot")

			// What Admit does with the request the tap let through: the
			// gone waiter leaves, b lends, and a has room.
			var a3 chan r17gRes
			if tc.a.QueueItems > 0 {
				a3 = r.mustQueue(t, context.Background(), "/r17g.A/Do", "a3")
				res := <-a2
				require.NoError(t, res.err, "a's head starts on b's idle slot")
				res.p.Release()
			} else {
				p := r.mustRun(t, "/r17g.A/Do", "a3")
				p.Release()
			}

			close(r.proceed)
			res := <-gone
			require.Nil(t, res.p)
			require.ErrorIs(t, res.err, context.Canceled)
			a1.Release()
			bx.Release()
			if a3 != nil {
				res := <-a3
				require.NoError(t, res.err)
				res.p.Release()
			}
			s := r.ctrl.Stats()
			b, _ := s.Class("b")
			require.EqualValues(t, 1, b.Cancelled, "the gone waiter counted once")
			require.Zero(t, b.Queued)
		})
	}
}

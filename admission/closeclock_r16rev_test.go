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

// A review found that Close decides a waiter whose caller has gone at the
// latest time any call showed the controller (its last), not at the
// controller's clock's now, as the waiter's own goroutine (ctxEnded) and
// every other call that finds it do: a waiter whose context was canceled
// after its request's deadline had passed (a client's RST_STREAM at its
// deadline) was counted and told cancelled by Close, where its own
// goroutine says DEADLINE_EXPIRED, final (the request's deadline passed,
// by the controller's clock).
func TestR16revCloseDecidesAGoneWaiterAtTheClocksNow(t *testing.T) {
	const m = "/r16rev.W/Do"
	clk := newClock()
	queued, proceed := make(chan struct{}), make(chan struct{})
	ctrl, err := admission.New(admission.WithClock(clk.Now),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventQueued && e.Tenant == "gone" {
				close(queued)
				<-proceed // its goroutine has not yet seen its context end
			}
		}),
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: 10 * time.Millisecond}))
	require.NoError(t, err)
	held, err := ctrl.Admit(context.Background(), admission.Request{Method: m, Size: -1})
	require.NoError(t, err)
	defer held.Release()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type res struct {
		p   *admission.Permit
		err error
	}
	out := make(chan res, 1)
	go func() {
		p, err := ctrl.Admit(ctx, admission.Request{Method: m, Size: -1, Tenant: "gone", Deadline: clk.Now().Add(50 * time.Millisecond)})
		out <- res{p, err}
	}()
	<-queued
	clk.Advance(100 * time.Millisecond) // past the request's deadline
	cancel()                            // then its client goes (canceled, no deadline cause)
	require.NoError(t, ctrl.Close())
	close(proceed)
	r := <-out
	require.Nil(t, r.p)
	require.True(t, errors.Is(r.err, context.Canceled), "%v", r.err)
	o := status.OutcomeOf(r.err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", r.err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "its request's deadline had passed by the controller's clock: %v", r.err)
	require.True(t, o.Final(), "no repeat can meet a deadline that has passed: %v", r.err)
	s, _ := ctrl.StatsAt(clk.Now()).Class("a")
	require.Zero(t, s.Cancelled)
	require.EqualValues(t, 1, s.Refused["DEADLINE_EXPIRED"])
}

package admission_test

// Streams hold their slots for their lifetimes (Request.Stream): how a
// running stream counts in the waits the controller predicts.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// TestOneOldStreamDoesNotStretchEveryUnaryWait: a class of 4 slots runs one
// stream that has lived two hours and three unary calls of 10 ms that have
// just started. A unary call with a second to live finds no slot: three
// slots free within 10 ms, so it should queue. The predicted wait spreads
// the stream's two hours over the 4 slots (half an hour) and refuses it
// DEADLINE_UNREACHABLE, counted as overload: a review found that the first
// stream model (a stream's remainder its age) spread the stream's two hours
// over the 4 slots (half an hour) so. A stream now holds its slot out of
// the count instead.
func TestOneOldStreamDoesNotStretchEveryUnaryWait(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ctrl, err := admission.New(admission.WithClock(func() time.Time { return t0 }),
		admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 8, ExpectedServiceTime: 10 * time.Millisecond}),
		admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	ctx := context.Background()
	stream, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Size: -1, Stream: true, Deadline: t0.Add(24 * time.Hour)}, t0)
	require.NoError(t, err)
	defer stream.Abandon()
	now := t0.Add(2 * time.Hour)
	for range 3 {
		p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Get", Size: 1, Deadline: now.Add(time.Second)}, now)
		require.NoError(t, err)
		defer p.Abandon()
	}
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := ctrl.AdmitAt(qctx, admission.Request{Method: "/s.S/Get", Size: 1, Deadline: now.Add(time.Second)}, now)
		done <- err
	}()
	if qerr, refused := queuedOrRefused(t, ctrl, done, 1); refused {
		ra, _ := status.RetryAfter(qerr)
		t.Fatalf("a call three 10 ms jobs away from a slot was refused %v (retry-after %v)", status.OutcomeOf(qerr).Reason, ra)
	}
	cancel()
	<-done
}

// queuedOrRefused waits until the request whose result done carries is
// refused, or until the class "work" holds queued requests.
func queuedOrRefused(t *testing.T, ctrl *admission.Controller, done chan error, queued int) (error, bool) {
	t.Helper()
	for {
		select {
		case err := <-done:
			return err, true
		default:
		}
		if s, _ := ctrl.Stats().Class("work"); s.Queued == queued {
			return nil, false
		}
		time.Sleep(time.Millisecond)
	}
}

// TestTenantWaitWithAStreamAndAUnaryRunning: tenant a may run 2 requests of
// the class and runs a stream (an hour old) and a unary call (10 ms mean)
// that just started; one request of a waits. The next request of a starts
// when a's unary call and then the waiting one end, about 20 ms; it has a
// second. A review found that tenantStartWaitLocked put it at the stream's
// remainder (j = 1: the second-smallest remainder, as if the starts came
// in rounds) and refused it DEADLINE_UNREACHABLE.
func TestTenantWaitWithAStreamAndAUnaryRunning(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ctrl, err := admission.New(admission.WithClock(func() time.Time { return t0 }),
		admission.WithClasses(admission.Class{Name: "work", Slots: 8, QueueItems: 8, TenantRunning: 2,
			ExpectedServiceTime: 10 * time.Millisecond}),
		admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	ctx := context.Background()
	stream, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Tenant: "a", Size: -1, Stream: true, Deadline: t0.Add(24 * time.Hour)}, t0)
	require.NoError(t, err)
	defer stream.Abandon()
	now := t0.Add(time.Hour)
	p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Get", Tenant: "a", Size: 1, Deadline: now.Add(time.Second)}, now)
	require.NoError(t, err)
	defer p.Abandon()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	waiting := make(chan error, 1)
	go func() {
		_, err := ctrl.AdmitAt(wctx, admission.Request{Method: "/s.S/Get", Tenant: "a", Size: 1, Deadline: now.Add(time.Second)}, now)
		waiting <- err
	}()
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Queued == 1 }, time.Second, time.Millisecond)
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := ctrl.AdmitAt(qctx, admission.Request{Method: "/s.S/Get", Tenant: "a", Size: 1, Deadline: now.Add(time.Second)}, now)
		done <- err
	}()
	defer func() { wcancel(); <-waiting }()
	if qerr, refused := queuedOrRefused(t, ctrl, done, 2); refused {
		t.Fatalf("a request 20 ms of its tenant's work from a start was refused %v", status.OutcomeOf(qerr).Reason)
	}
	cancel()
	<-done
}

// TestAStreamEndsByItsDeadline: the class's one slot is held by a stream
// that has lived an hour and whose deadline (the handler's context's) is a
// minute away: the slot frees within a minute. A call with five minutes to
// live must queue: a review found it refused DEADLINE_UNREACHABLE and told
// to come back in about an hour, the stream's remainder ignoring its own
// deadline.
func TestAStreamEndsByItsDeadline(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ctrl, err := admission.New(admission.WithClock(func() time.Time { return t0 }),
		admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 8, ExpectedServiceTime: 10 * time.Millisecond}),
		admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	ctx := context.Background()
	now := t0.Add(time.Hour)
	stream, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Size: -1, Stream: true, Deadline: now.Add(time.Minute)}, t0)
	require.NoError(t, err)
	defer stream.Abandon()
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := ctrl.AdmitAt(qctx, admission.Request{Method: "/s.S/Get", Size: 1, Deadline: now.Add(5 * time.Minute)}, now)
		done <- err
	}()
	if qerr, refused := queuedOrRefused(t, ctrl, done, 1); refused {
		ra, _ := status.RetryAfter(qerr)
		t.Fatalf("a call with 5 min to live, behind a stream that ends within a minute, was refused %v (retry-after %v)",
			status.OutcomeOf(qerr).Reason, ra)
	}
	cancel()
	<-done
}

package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// A waiter whose caller has gone (its context ended, its own goroutine not
// yet run to see it) was started by a release's pump: the caller got a
// permit under "the decision stands", a slot went to no one, and a live
// waiter behind it kept waiting. The pump now takes such a waiter out as
// its context's ending says — cancelled when its caller went away,
// DEADLINE_EXPIRED when a deadline passed (as ctxEnded would), counted
// once — and gives the slot to the next live waiter, on the test clock
// (Admit, Release) and a virtual one (AdmitAt, ReleaseAt).
func TestR16bPumpSkipsAGoneWaiter(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		for _, gone := range []r16bGone{r16bCanceled, r16bDeadline} {
			t.Run(r16ClockName(virtual)+"/"+gone.name, func(t *testing.T) {
				r16bGoneWaiter(t, virtual, gone, r16bBy{"release", true, 0})
			})
		}
	}
}

// r16bGone is how the gone waiter's context ends, and what it is told.
type r16bGone struct {
	name   string
	ctx    func() (context.Context, context.CancelFunc)
	reason status.Reason // UNSPECIFIED: cancelled
}

var (
	r16bCanceled = r16bGone{"canceled", func() (context.Context, context.CancelFunc) {
		return context.WithCancel(context.Background())
	}, status.ReasonUnspecified}
	// A context canceled with context.DeadlineExceeded as its cause (a
	// gRPC client's RST_STREAM at its deadline): a deadline passed.
	r16bDeadline = r16bGone{"deadline", func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancelCause(context.Background())
		return ctx, func() { cancel(context.DeadlineExceeded) }
	}, status.ReasonDeadlineExpired}
)

// r16bBy is the call that finds the gone waiter.
type r16bBy struct {
	by string
	// goneFirst: the gone waiter is queued before the live one.
	goneFirst bool
	// live is what the live waiter gets: admitted (0) or refused.
	live status.Reason
}

// r16bGoneWaiter runs class "a" (1 slot, optional) with one request
// running and two waiting, one whose caller goes away (gone: its goroutine
// held in the observer that receives its EventQueued, its context ended
// there) and one live; then has by's call find them, and checks that the
// gone waiter leaves as its context says, counted once, and that the live
// one gets the slot (with a release, if by's call leaves it waiting) or
// by's refusal.
func r16bGoneWaiter(t *testing.T, virtual bool, gone r16bGone, c r16bBy) {
	const m = "/r16b.W/Do"
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	clk := newClock()
	goneQueued, liveQueued, proceed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	ctrl, err := admission.New(admission.WithClock(clk.Now), admission.WithMeterProvider(mp),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind != admission.EventQueued {
				return
			}
			switch e.Tenant {
			case "gone":
				close(goneQueued)
				<-proceed
			case "live":
				close(liveQueued)
			}
		}),
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 4, Optional: true, ExpectedServiceTime: 100 * time.Millisecond}))
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			require.NoError(t, ctrl.Close())
		}
	}()
	admit := func(ctx context.Context, r admission.Request) (*admission.Permit, error) {
		if virtual {
			return ctrl.AdmitAt(ctx, r, clk.Now())
		}
		return ctrl.Admit(ctx, r)
	}

	held, err := admit(context.Background(), admission.Request{Method: m, Size: -1})
	require.NoError(t, err)
	ctx, cancel := gone.ctx()
	defer cancel()
	type res struct {
		p   *admission.Permit
		err error
	}
	goneRes, live := make(chan res, 1), make(chan res, 1)
	queue := func(tenant string, ctx context.Context, out chan res, queued chan struct{}) {
		go func() {
			p, err := admit(ctx, admission.Request{Method: m, Size: -1, Tenant: tenant})
			out <- res{p, err}
		}()
		<-queued
	}
	if c.goneFirst {
		queue("gone", ctx, goneRes, goneQueued)
		queue("live", context.Background(), live, liveQueued)
	} else {
		queue("live", context.Background(), live, liveQueued)
		queue("gone", ctx, goneRes, goneQueued)
	}
	cancel() // the gone waiter's context ends (before the request's deadline: it has none)
	now := clk.Advance(10 * time.Millisecond)
	ovr := func(o admission.Override) {
		o.Actor, o.Reason, o.TTL = "test", "r16b", time.Hour
		var err error
		if virtual {
			_, err = ctrl.SetOverrideAt(context.Background(), o, now)
		} else {
			_, err = ctrl.SetOverride(context.Background(), o)
		}
		require.NoError(t, err)
	}
	switch c.by {
	case "release":
		if virtual {
			held.ReleaseAt(now)
		} else {
			held.Release()
		}
	case "freeze":
		ovr(admission.Override{Class: "a", Freeze: true})
	case "degraded":
		ovr(admission.Override{Mode: admission.ModeDegraded})
	case "trim", "trim newest":
		ovr(admission.Override{Class: "a", QueueItems: 1})
	case "close":
		require.NoError(t, ctrl.Close())
		closed = true
	}
	close(proceed)
	g := <-goneRes
	if g.p != nil {
		g.p.Abandon()
	}
	require.Nil(t, g.p, "no slot for a caller that has gone")
	require.True(t, errors.Is(g.err, context.Canceled), "its context's error: %v", g.err)
	o := status.OutcomeOf(g.err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", g.err)
	require.Equal(t, gone.reason, o.Reason, "as its context's ending says, not by's refusal: %v", g.err)

	var l res
	if c.live != 0 || c.by == "release" {
		l = <-live
	} else {
		// Still waiting, in its place: the release gives it
		// the slot.
		select {
		case l = <-live:
			t.Fatalf("the live waiter was decided: %v", l.err)
		default:
		}
		if virtual {
			held.ReleaseAt(now)
		} else {
			held.Release()
		}
		l = <-live
	}
	if c.live == 0 {
		require.NoError(t, l.err, "the live waiter gets the slot")
		require.NotNil(t, l.p)
		l.p.Abandon()
	} else {
		require.Nil(t, l.p)
		require.Equal(t, c.live, status.OutcomeOf(l.err).Reason, "%v", l.err)
	}
	held.Release() // (a second end does nothing)

	wantRefused := map[string]uint64{}
	wantCancelled := uint64(0)
	if gone.reason == status.ReasonUnspecified {
		wantCancelled = 1
	} else {
		wantRefused[status.ReasonName(gone.reason)]++
	}
	if c.live != 0 {
		wantRefused[status.ReasonName(c.live)]++
	}
	wantAdmitted := uint64(1)
	if c.live == 0 {
		wantAdmitted = 2
	}
	s, _ := ctrl.StatsAt(now).Class("a")
	require.Equal(t, wantCancelled, s.Cancelled, "counted once, as its context says")
	for r, n := range s.Refused {
		require.Equal(t, wantRefused[r], n, "refused %s: %v", r, s.Refused)
	}
	for r, n := range wantRefused {
		require.Equal(t, n, s.Refused[r], "refused %s: %v", r, s.Refused)
	}
	require.Equal(t, wantAdmitted, s.Admitted, "the gone waiter was never started")
	if !closed {
		ms := collect(t, reader)
		got := map[string]int64{}
		for _, dp := range ms["tollgate.admission.decisions"].Data.(metricdata.Sum[int64]).DataPoints {
			a := attrs(dp.Attributes)
			got[a["decision"]+":"+a["reason"]] += dp.Value
		}
		want := map[string]int64{"admitted:": int64(wantAdmitted)}
		if wantCancelled > 0 {
			want["cancelled:"] = 1
		}
		for r, n := range wantRefused {
			want["refused:"+r] = int64(n)
		}
		for k := range got {
			if got[k] == 0 {
				delete(got, k)
			}
		}
		require.Equal(t, want, got)
		var dequeueMisses int64
		if misses, ok := ms["tollgate.deadline.misses"]; ok {
			for _, dp := range misses.Data.(metricdata.Sum[int64]).DataPoints {
				if attrs(dp.Attributes)["stage"] == "dequeue" {
					dequeueMisses += dp.Value
				}
			}
		}
		require.EqualValues(t, wantRefused["DEADLINE_EXPIRED"], dequeueMisses, "a dequeue miss only for a deadline that passed")
	}
}

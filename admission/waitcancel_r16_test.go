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
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// A review found that a waiter holds no context: a release, another
// request's arrival or Stats, finding a waiter that can no longer finish by
// its deadline, drops it DEADLINE_EXPIRED even when its caller had already
// gone (its context canceled, no deadline passed) and only its own
// goroutine had not yet run to see it. The caller's cancellation was then
// reported and counted as the queue's deadline drop — a refusal in
// tollgate.admission.decisions, a dequeue deadline miss, an overload
// refusal in the degradation window — rather than as cancelled, as the
// same waiter is when its own goroutine gets there first.
//
// The waiter's goroutine is held, deterministically, in the observer that
// receives its EventQueued (emitted on that goroutine once the waiter is in
// the queue, before it waits): its context is canceled there, and another
// call then finds it in the queue unable to finish. On the test clock
// (Admit) and on a virtual clock (AdmitAt, whose contexts carry no
// deadline and whose time is the caller's), whichever call decides, it
// must be reported and counted as cancelled.
func TestR16CanceledWaiterDecidedByAnotherCallIsCancelled(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		for _, by := range []string{"stats", "release", "arrival"} {
			t.Run(r16ClockName(virtual)+"/"+by, func(t *testing.T) {
				s, got, dequeueMisses, err := r16DecidedByAnother(t, virtual, by, func() (context.Context, context.CancelFunc) {
					return context.WithCancel(context.Background())
				}, 950*time.Millisecond)
				require.True(t, errors.Is(err, context.Canceled), "the caller's own cancellation: %v", err)
				o := status.OutcomeOf(err)
				require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
				require.Equal(t, status.ReasonUnspecified, o.Reason, "no deadline drop: %v", err)
				require.EqualValues(t, 1, s.Cancelled, "counted as cancelled")
				require.Zero(t, s.Refused["DEADLINE_EXPIRED"], "not as a deadline drop")
				require.EqualValues(t, 1, got["cancelled:"], "%v", got)
				require.Zero(t, got["refused:DEADLINE_EXPIRED"], "%v", got)
				require.Zero(t, dequeueMisses, "no dequeue deadline miss")
			})
		}
	}
}

// The same waiter whose context ended by a deadline — its cause
// context.DeadlineExceeded, or canceled once the request's own deadline
// had passed by the deciding call's time (on the test clock; on a virtual
// clock it is judged at the time its context ended, before its deadline,
// and is cancelled) — is the queue's DEADLINE_EXPIRED whichever call decides, as ctxEnded
// says, and its error wraps its context's, as Admit's doc says.
func TestR16WaiterEndedByADeadlineDecidedByAnotherCallIsDeadlineExpired(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		for _, c := range []struct {
			name    string
			ctx     func() (context.Context, context.CancelFunc)
			advance time.Duration
			is      error
		}{
			{"cause DeadlineExceeded", func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancelCause(context.Background())
				return ctx, func() { cancel(context.DeadlineExceeded) }
			}, 950 * time.Millisecond, context.Canceled},
			{"request deadline passed", func() (context.Context, context.CancelFunc) {
				return context.WithCancel(context.Background())
			}, 1100 * time.Millisecond, context.Canceled},
		} {
			t.Run(r16ClockName(virtual)+"/"+c.name, func(t *testing.T) {
				s, got, dequeueMisses, err := r16DecidedByAnother(t, virtual, "stats", c.ctx, c.advance)
				require.ErrorIs(t, err, c.is)
				o := status.OutcomeOf(err)
				if virtual && c.name == "request deadline passed" {
					// On a virtual clock a waiter whose caller has gone
					// is judged at the time its context ended, the latest
					// the caller had given, before the call that moves
					// the time past its deadline (r17c): cancelled.
					require.Equal(t, status.ReasonUnspecified, o.Reason, "%v", err)
					require.EqualValues(t, 1, s.Cancelled)
					require.Zero(t, s.Refused["DEADLINE_EXPIRED"])
					require.EqualValues(t, 1, got["cancelled:"], "%v", got)
					require.Zero(t, got["refused:DEADLINE_EXPIRED"], "%v", got)
					require.Zero(t, dequeueMisses)
					return
				}
				require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
				require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
				require.Zero(t, s.Cancelled)
				require.EqualValues(t, 1, s.Refused["DEADLINE_EXPIRED"])
				require.Zero(t, got["cancelled:"], "%v", got)
				require.EqualValues(t, 1, got["refused:DEADLINE_EXPIRED"], "%v", got)
				require.EqualValues(t, 1, dequeueMisses)
			})
		}
	}
}

func r16ClockName(virtual bool) string {
	if virtual {
		return "virtual clock"
	}
	return "test clock"
}

// r16DecidedByAnother queues a request with a deadline 1 s away behind a
// running one (class "a": 1 slot, 100 ms of expected service), on the test
// clock (Admit) or a virtual one (AdmitAt), holds its goroutine in the
// observer once it is in the queue, ends its context there (the context
// mk makes, by the cancel it returns), advances the clock by advance, and
// has another call, by ("stats", "release" of the running request, or a
// refused "arrival"), find it. It returns the class's stats, the decisions
// counted by decision and reason, the dequeue deadline misses counted,
// and the waiter's error.
func r16DecidedByAnother(t *testing.T, virtual bool, by string, mk func() (context.Context, context.CancelFunc), advance time.Duration) (admission.ClassStats, map[string]int64, int64, error) {
	t.Helper()
	const m = "/r16.W/Do"
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	clk := newClock()
	queued, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ctrl, err := admission.New(admission.WithClock(clk.Now), admission.WithMeterProvider(mp),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventQueued {
				once.Do(func() { close(queued); <-proceed })
			}
		}),
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}))
	require.NoError(t, err)
	defer func() { require.NoError(t, ctrl.Close()) }()
	admit := func(ctx context.Context, r admission.Request) (*admission.Permit, error) {
		if virtual {
			return ctrl.AdmitAt(ctx, r, clk.Now())
		}
		return ctrl.Admit(ctx, r)
	}

	held, err := admit(context.Background(), admission.Request{Method: m, Size: -1})
	require.NoError(t, err)
	ctx, cancel := mk()
	defer cancel()
	done := make(chan error, 1)
	go func() {
		p, err := admit(ctx, admission.Request{Method: m, Size: -1, Deadline: epoch.Add(time.Second)})
		if p != nil {
			p.Abandon()
		}
		done <- err
	}()
	<-queued // in the queue; its goroutine is held before it waits
	cancel() // its context ends there
	// 950 ms: 50 ms before its deadline, with 100 ms of service to do, it
	// can no longer finish, and the next call that looks drops it.
	now := clk.Advance(advance)
	switch by {
	case "stats":
		if virtual {
			ctrl.StatsAt(now)
		} else {
			ctrl.Stats()
		}
	case "release":
		if virtual {
			held.ReleaseAt(now)
		} else {
			held.Release()
		}
	case "arrival":
		// Refused (it cannot finish in 1 ms), after it looked.
		_, err := admit(context.Background(), admission.Request{Method: m, Size: -1, Deadline: now.Add(time.Millisecond)})
		require.Error(t, err)
	}
	close(proceed)
	err = <-done
	held.Release() // (a second end does nothing)

	s, _ := ctrl.StatsAt(now).Class("a")
	ms := collect(t, reader)
	got := map[string]int64{}
	for _, dp := range ms["tollgate.admission.decisions"].Data.(metricdata.Sum[int64]).DataPoints {
		a := attrs(dp.Attributes)
		got[a["decision"]+":"+a["reason"]] += dp.Value
	}
	var dequeueMisses int64
	if misses, ok := ms["tollgate.deadline.misses"]; ok {
		for _, dp := range misses.Data.(metricdata.Sum[int64]).DataPoints {
			if attrs(dp.Attributes)["stage"] == "dequeue" {
				dequeueMisses += dp.Value
			}
		}
	}
	return s, got, dequeueMisses, err
}

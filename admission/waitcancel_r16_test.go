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
	const m = "/r16.W/Do"
	for _, virtual := range []bool{false, true} {
		for _, by := range []string{"stats", "release", "arrival"} {
			name := "test clock/" + by
			if virtual {
				name = "virtual clock/" + by
			}
			t.Run(name, func(t *testing.T) {
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
				ctx, cancel := context.WithCancel(context.Background())
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
				cancel() // its caller goes away, before any deadline
				// 50 ms before its deadline, with 100 ms of service to do: it
				// can no longer finish, and the next call that looks drops it.
				now := clk.Advance(950 * time.Millisecond)
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

				require.True(t, errors.Is(err, context.Canceled), "the caller's own cancellation: %v", err)
				o := status.OutcomeOf(err)
				require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
				require.Equal(t, status.ReasonUnspecified, o.Reason, "no deadline drop: %v", err)
				s, _ := ctrl.StatsAt(now).Class("a")
				require.EqualValues(t, 1, s.Cancelled, "counted as cancelled")
				require.Zero(t, s.Refused["DEADLINE_EXPIRED"], "not as a deadline drop")
				ms := collect(t, reader)
				got := map[string]int64{}
				for _, dp := range ms["tollgate.admission.decisions"].Data.(metricdata.Sum[int64]).DataPoints {
					a := attrs(dp.Attributes)
					got[a["decision"]+":"+a["reason"]] += dp.Value
				}
				require.EqualValues(t, 1, got["cancelled:"], "%v", got)
				require.Zero(t, got["refused:DEADLINE_EXPIRED"], "%v", got)
				if misses, ok := ms["tollgate.deadline.misses"]; ok {
					for _, dp := range misses.Data.(metricdata.Sum[int64]).DataPoints {
						require.NotEqual(t, "dequeue", attrs(dp.Attributes)["stage"], "no dequeue deadline miss")
					}
				}
			})
		}
	}
}

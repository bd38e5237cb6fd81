package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// cancellingClock is a client clock that cancels a context the first time
// it is read once armed: the owner reads the clock to fit a repeat's
// backoff in the deadline just before it withdraws the repeat's
// retry-budget token and waits, so the caller's cancellation lands
// deterministically inside that wait.
type cancellingClock struct {
	armed  atomic.Bool
	cancel atomic.Pointer[context.CancelFunc]
}

func (c *cancellingClock) now() time.Time {
	if c.armed.CompareAndSwap(true, false) {
		if f := c.cancel.Load(); f != nil {
			(*f)()
		}
	}
	return time.Now()
}

// A review found that the retry-budget token the owner withdraws for a
// repeat was kept when the caller's context ended during the repeat's
// backoff: the repeat was never sent, yet the budget (which bounds repeats
// sent, budget.RetryBudget.Return) counted it, and another attempt to the
// same target found no token for a repeat it needed.
//
// The target's budget holds one token and never refills. Call A is refused
// without effect with a long retry-after and cancelled during its backoff;
// call B is refused once and must then be repeated with that token.
func TestRetryTokenOfARepeatCancelledInItsBackoffGoesBack(t *testing.T) {
	var bRuns atomic.Int32
	clock := &cancellingClock{}
	svc := &testsvc.Service{
		GetFunc: func(_ context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			if r.GetKey() == "a" {
				clock.armed.Store(true)
				return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(30*time.Second)))
			}
			if bRuns.Add(1) == 1 {
				return nil, shed()
			}
			return &testingv1.GetResponse{Value: "ok"}, nil
		},
		WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			clock.armed.Store(true)
			return status.WithoutEffect(status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(30*time.Second)))
		},
	}
	for _, kind := range []string{"unary", "stream"} {
		t.Run(kind, func(t *testing.T) {
			bRuns.Store(0)
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3),
				interceptor.WithAttemptTimeout(time.Minute), interceptor.WithClientClock(clock.now),
				interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1)))...))

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			clock.cancel.Store(&cancel)
			var err error
			if kind == "unary" {
				_, err = client.Get(ctx, &testingv1.GetRequest{Key: "a"})
			} else {
				var st grpc.ServerStreamingClient[testingv1.WatchResponse]
				st, err = client.Watch(ctx, &testingv1.WatchRequest{Key: "a"})
				if err == nil {
					_, err = st.Recv()
				}
			}
			require.Error(t, err)
			require.Error(t, ctx.Err(), "the call ended once cancelled in its backoff")
			require.False(t, clock.armed.Load(), "the clock cancelled the call")

			_, err = client.Get(t.Context(), &testingv1.GetRequest{Key: "b"})
			require.NoError(t, err, "call B found no retry-budget token: call A's repeat, never sent, kept it")
			require.EqualValues(t, 2, bRuns.Load())
		})
	}
}

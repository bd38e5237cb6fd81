package interceptor_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
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

// oneRetryToken is a retry budget of one token that nothing refills.
func oneRetryToken() interceptor.ClientOption {
	return interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1))
}

// requireCallBGetsTheToken requires a call B (Get "b") to succeed on its
// repeat, which needs the budget's one token back, its handler having run
// twice (bRuns: it sheds its first try).
func requireCallBGetsTheToken(t *testing.T, client testingv1.TestServiceClient, bRuns *atomic.Int32) {
	t.Helper()
	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "b"})
	require.NoError(t, err, "call B found no retry-budget token: call A's repeat, never sent, kept it (%v)", status.OutcomeOf(err))
	require.EqualValues(t, 2, bRuns.Load())
}

// requireCallBFindsNoToken requires a call B (Get "b") to be refused
// RETRY_BUDGET_EXHAUSTED for its repeat, the budget's one token staying
// spent, its handler having run once (bRuns: it sheds its first try). why
// says what call B's success would mean.
func requireCallBFindsNoToken(t *testing.T, client testingv1.TestServiceClient, bRuns *atomic.Int32, why string) {
	t.Helper()
	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "b"})
	require.Equal(t, status.ReasonRetryBudgetExhausted, status.OutcomeOf(err).Reason, why+": %v", err)
	require.EqualValues(t, 1, bRuns.Load())
}

// shedFirstGet is call B's Get handler: it sheds its first try, so that
// call B needs a retry-budget token for its repeat, and answers "ok" after,
// counting its runs in bRuns.
func shedFirstGet(bRuns *atomic.Int32) func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
	return func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if bRuns.Add(1) == 1 {
			return nil, shed()
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}
}

// oneTokenClient is a client of end through DialOptions with three tries, a
// minute per attempt and a retry budget of one token (oneRetryToken), inner
// chained below tollgate's interceptor.
func oneTokenClient(t *testing.T, end *testsvc.Endpoint, inner grpc.UnaryClientInterceptor) testingv1.TestServiceClient {
	t.Helper()
	return testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3),
		interceptor.WithAttemptTimeout(time.Minute), oneRetryToken()),
		grpc.WithChainUnaryInterceptor(inner))...))
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
				oneRetryToken())...))

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

			requireCallBGetsTheToken(t, client, &bRuns)
		})
	}
}

// mixedApply is a target of two backends behind one name, as in a rolling
// deploy that adds a record store: Apply with key "warm" and the first try
// of every other key reach the store-less backend, which runs the handler
// (counted in effects) and whose answer is lost; later tries reach the
// store backend. A query for a call whose Apply was warm reaches the
// store-less backend (UNIMPLEMENTED: it marks the target recordless); the
// others reach the store backend.
func mixedApply(t *testing.T, effects *atomic.Int64) testingv1.TestServiceClient {
	t.Helper()
	var (
		tries       atomic.Int64
		warmAttempt atomic.Value // the attempt ID of the warm-up call
	)
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch r := req.(type) {
		case *tollgatev1.FenceAttemptRequest:
			if warmAttempt.Load() == r.GetAttemptId() {
				return nil, grpcstatus.Error(codes.Unimplemented, "no records")
			}
		case *testingv1.ApplyRequest:
			if r.GetKey() == "warm" {
				if hdr := metadata.ValueFromIncomingContext(ctx, "tollgate"); len(hdr) == 1 {
					warmAttempt.Store(fieldOf(hdr[0], "a"))
				}
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			}
			if tries.Add(1) == 1 {
				effects.Add(1)
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			}
		}
		return handler(ctx, req)
	})
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		effects.Add(1)
		return &testingv1.ApplyResponse{}, nil
	}}
	return fastClient(t, recordedServer(t, svc, memoryStore(t), outer), 3)
}

func fieldOf(hdr, key string) string {
	for f := range strings.SplitSeq(hdr, ";") {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// A review found that an owner refused ATTEMPT_FENCED by a fence another
// run of its handler made (an explicit key is a ballot across runs) jumped
// past the fence and repeated a method with side effects although its
// target was known to keep no records at some backends: the fence vouches
// only for its own store, and the earlier run's try may have run at a
// backend without one. An owner that fenced the try itself declines that
// repeat (resolve, unvouchedRepeat); a fence it is told of must be no
// stronger.
//
// The target is marked recordless (a warm-up call). Run 1 of the handler
// (call "pay") reaches the store-less backend, runs, and is lost; its
// query fences it at the store backend and it ends UNKNOWN. Run 2's try 1
// is refused ATTEMPT_FENCED there: it must not run the handler again.
func TestToldFenceAtAMixedTargetIsNotJumped(t *testing.T) {
	var effects atomic.Int64
	cli := mixedApply(t, &effects)
	_, err := cli.Apply(t.Context(), &testingv1.ApplyRequest{Key: "warm"})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "precondition: %v", err)

	actx, err := interceptor.StartAttempt(t.Context(), 0, time.Minute)
	require.NoError(t, err)
	actx = interceptor.WithCallKey(actx, "pay")
	_, err = cli.Apply(actx, &testingv1.ApplyRequest{Key: "k"})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "precondition: run 1 ends in doubt: %v", err)
	require.Equal(t, int64(1), effects.Load())

	_, err = cli.Apply(actx, &testingv1.ApplyRequest{Key: "k"})
	require.Equal(t, int64(1), effects.Load(), "run 2 jumped the fence and ran the handler again: %v", err)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotContains(t, []codes.Code{codes.Unavailable, codes.ResourceExhausted}, grpcstatus.Code(err), "an UNKNOWN a generic policy would repeat")
	require.NotEmpty(t, o.Detail.GetAttemptId(), "the answer names the attempt")
}

// A review found that a repeat grpc-go failed before its request left the
// client (no OutHeader: NOT_SENT) kept the retry-budget token proceed
// withdrew for it, although the budget bounds repeats sent
// (budget.RetryBudget.Return): a target that no connection reaches drained
// the budget of every call to it, and a call's later repeats were refused
// RETRY_BUDGET_EXHAUSTED for tries none of which was ever sent. With one
// token, a call to an unreachable target makes its three tries, each never
// sent, and ends NOT_SENT.
func TestRetryTokenOfARepeatNeverSentGoesBack(t *testing.T) {
	conn, err := grpc.NewClient("passthrough:///unreachable", append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return nil, errors.New("unreachable") }),
	}, interceptor.DialOptions(fastRetry(3),
		oneRetryToken())...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	cli := testingv1.NewTestServiceClient(conn)
	for range 2 {
		_, err := cli.Get(t.Context(), &testingv1.GetRequest{})
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
		require.Equal(t, status.ReasonNotSent, o.Reason, "a repeat never sent spent the budget's token: %v", err)
		require.EqualValues(t, 3, o.Detail.GetTry(), "the call made its three tries: %v", err)
	}
}

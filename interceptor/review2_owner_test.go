package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// A second review found that be8037d gave back the retry-budget token of a
// repeat that never left the client where a stream's try is settled
// (finishTryLocked, which a panic below the interceptor reaches too) and
// where a unary try returns, but not where a unary try panics below the
// interceptor (owner.invoke settles it in its deferred function): a repeat
// an inner interceptor panicked on before anything was sent kept its
// token, though its unit went back to the allowance, and a caller that
// recovered the panic found the target's budget short by one.
//
// The target's budget holds one token and never refills. Call A's first
// try is shed; its repeat panics in an inner interceptor before it calls
// the invoker (never sent). Call B is shed once and must then be repeated
// with that token.
func TestRetryTokenOfARepeatThatPanickedBeforeSendingGoesBack(t *testing.T) {
	var bRuns atomic.Int32
	svc := &testsvc.Service{
		GetFunc: func(_ context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			if r.GetKey() == "a" {
				return nil, shed()
			}
			if bRuns.Add(1) == 1 {
				return nil, shed()
			}
			return &testingv1.GetResponse{Value: "ok"}, nil
		},
		WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			return shed()
		},
	}
	for _, kind := range []string{"unary", "stream"} {
		t.Run(kind, func(t *testing.T) {
			bRuns.Store(0)
			var aTries atomic.Int32
			unaryPanics := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if r, ok := req.(*testingv1.GetRequest); ok && r.GetKey() == "a" && aTries.Add(1) > 1 {
					panic("an inner interceptor panics on the repeat, before sending it")
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			streamPanics := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				if method == testingv1.TestService_Watch_FullMethodName && aTries.Add(1) > 1 {
					panic("an inner interceptor panics on the repeat, before sending it")
				}
				return streamer(ctx, desc, cc, method, opts...)
			}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			dial := append(interceptor.DialOptions(fastRetry(3),
				interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1))),
				grpc.WithChainUnaryInterceptor(unaryPanics), grpc.WithChainStreamInterceptor(streamPanics))
			client := testingv1.NewTestServiceClient(end.DialT(t, dial...))

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			func() {
				defer func() { require.NotNil(t, recover(), "precondition: call A's repeat panics") }()
				if kind == "unary" {
					_, _ = client.Get(ctx, &testingv1.GetRequest{Key: "a"})
					return
				}
				st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "a"})
				if err == nil {
					_, _ = st.Recv()
				}
			}()
			require.EqualValues(t, 2, aTries.Load(), "precondition: call A's repeat was reached")

			_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "b"})
			require.NoError(t, err, "call B found no retry-budget token: call A's repeat, never sent, kept it (%v)", status.OutcomeOf(err))
			require.EqualValues(t, 2, bRuns.Load())
		})
	}
}

package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
)

// A review found the defect this test guards against.
//
// The server interceptor's wait for a server-streaming call's first
// request (receiveFirst) is bounded by the deadline its handler would have,
// which counts the context the stream comes with: a stream interceptor
// chained outside tollgate's may give the stream a context of its own (a
// timeout interceptor, one that cancels its streams when the server
// drains), as tollgate's own comments allow (contextEnded). grpc-go's
// RecvMsg watches only the transport's context, not that one. The wait
// trusted any context's deadline to end RecvMsg (receiving on the handler's
// goroutine whenever the context's deadline came first), and, once that
// context had ended, waited for the receive to return: a client that opened
// the stream and sent nothing held it, and the goroutine serving it, for as
// long as it kept the stream open, past the handler's deadline (the outer
// interceptor's) or its cancellation. A wait the outer context ends now
// ends with it, refused as a try whose context ended before its record was
// begun is (nothing was begun or run: NOT_ADMITTED naming the try, not
// final while the attempt's deadline has not passed): DEADLINE_EXPIRED,
// counted once on arrival, when its deadline ended it; no reason, counted
// nowhere, when it was cancelled before any deadline.
func TestR16RevStreamRequestWaitHonoursAnOuterInterceptorsContext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outer   func(context.Context) (context.Context, context.CancelFunc)
		wantWhy status.Reason
		want    map[string]int64
	}{
		{name: "outer-timeout", outer: func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 300*time.Millisecond)
		}, wantWhy: status.ReasonDeadlineExpired, want: map[string]int64{"arrival": 1}},
		{name: "outer-cancel", outer: func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			stop := time.AfterFunc(300*time.Millisecond, cancel)
			return ctx, func() { stop.Stop(); cancel() }
		}, wantWhy: status.ReasonUnspecified, want: map[string]int64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp, reader := testMeter(t)
			store := memoryStore(t)
			outer := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
				ctx, cancel := tc.outer(ss.Context())
				defer cancel()
				return handler(srv, &r16revCtxStream{ServerStream: ss, ctx: ctx})
			}
			c := newConsumer()
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, c) },
				append([]grpc.ServerOption{grpc.ChainStreamInterceptor(outer)},
					serverOpts(interceptor.WithServerMeterProvider(mp), interceptor.WithAttemptStore(store),
						interceptor.WithMaxAttemptTime(time.Minute))...)...)
			conn := r16Ready(t, end.DialT(t))

			id, _, err := r16SilentStream(t, conn, "the server kept waiting for the request after the outer interceptor's context ended")
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.Equal(t, tc.wantWhy, o.Reason, "%v", err)
			require.False(t, o.Final(), "the attempt's deadline has not passed: %v", err)
			require.Equal(t, id.String(), o.Detail.GetAttemptId(), "the refusal names the try it answers")
			require.Equal(t, uint32(1), o.Detail.GetTry())

			misses := func() map[string]int64 {
				var rm metricdata.ResourceMetrics
				require.NoError(t, reader.Collect(t.Context(), &rm))
				return r14Misses(t, rm)
			}
			time.Sleep(100 * time.Millisecond) // whatever would count has had time to
			require.Equal(t, tc.want, misses())
			require.Zero(t, c.runs.Load(), "nothing ran")
			require.Zero(t, store.Len(), "nothing was begun")
		})
	}
}

// r16revCtxStream is a stream an interceptor chained outside tollgate's
// gives a context of its own.
type r16revCtxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *r16revCtxStream) Context() context.Context { return s.ctx }

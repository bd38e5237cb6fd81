package interceptor_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found that an explicitly keyed server-streaming call whose request is
// fingerprinted (Consume) and whose answer is lost is resolved with
// FenceAttempt, which carries no request. owner.resolve (owner.go:428) sends
// a verifying try for an explicit key only for unary calls; a stream takes
// the record at its word. When the record is another request's (an earlier
// call, or an earlier run of the calling handler, under the same key), the
// stream reports that record's outcome as its own: COMMITTED ("the effect
// took place") for a request that never ran, or the other request's
// definite error. The server itself refuses that request as
// ATTEMPT_REQUEST_MISMATCH (TestExplicitKeyServerStreamWithAnotherRequestIsAMismatch):
// DESIGN.md §2.2, "a mismatch is refused, never replayed wrongly".
func TestRegression14ClientExplicitStreamLostMismatchIsNotAnsweredFromTheRecord(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first *testingv1.ConsumeRequest
	}{
		{"record succeeded", &testingv1.ConsumeRequest{Key: "k", Count: 2}},
		{"record failed", &testingv1.ConsumeRequest{Key: "missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConsumer()
			store := memoryStore(t)
			// A proxy in front of the server loses the answer of the second
			// Consume (it says INTERNAL instead).
			var consumes atomic.Int64
			lose := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if info.FullMethod != consumeMethod || consumes.Add(1) != 2 {
					return h(srv, ss)
				}
				_ = h(srv, ss)
				return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
			})
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				testingv1.RegisterTestServiceServer(s, c)
				tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
			}, append([]grpc.ServerOption{lose}, serverOpts(interceptor.WithAttemptStore(store))...)...)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
			actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)
			ctx := interceptor.WithCallKey(actx, "feed")

			st, err := client.Consume(ctx, tc.first)
			require.NoError(t, err)
			_, _ = recvConsumed(st)
			require.Equal(t, int64(1), c.runs.Load())

			// Another request under the same key: the server refuses it as a
			// mismatch, but the proxy loses that answer.
			st, err = client.Consume(ctx, &testingv1.ConsumeRequest{Key: "k", Count: 3})
			require.NoError(t, err)
			got, err := recvConsumed(st)
			require.Empty(t, got)
			require.Equal(t, int64(1), c.runs.Load(), "the handler never ran for the second request")
			o := status.OutcomeOf(err)
			require.NotEqual(t, status.KindCommitted, o.Kind, "the second request never ran, yet: %v", err)
			require.False(t, o.Kind == status.KindFailed && o.Reason != status.ReasonAttemptRequestMismatch,
				"the first request's definite error is not the second's: %v", err)
			require.Equal(t, status.ReasonAttemptRequestMismatch, o.Reason,
				"a verifying try (as for unary calls) learns the mismatch; got %v", err)
		})
	}
}

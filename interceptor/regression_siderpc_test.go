package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// TestSideRPCOfALaterInterceptorIsNotTheTry: an interceptor placed after
// tollgate's makes an auxiliary RPC with the context it was given (an
// auth-token or config fetch) on the same connection, then fails locally
// without sending the call. The side RPC's events are not the try's: its
// InTrailer does not make the try look answered by its peer (an early
// review found they were booked to the try). But nothing the client sees
// tells this side RPC from the try itself sent under a method the
// interceptor renamed (TestRenamedTryIsMaybeSent): the
// try's own method never started and an RPC of another method may have
// been sent, so the try is maybe sent, never NOT_SENT — its outcome
// UNKNOWN and its grant held, the safe side (DESIGN.md §3.5: a try that may
// have run is not repeated without a query). A side RPC followed by the try
// itself leaves the try's own events to decide
// (TestAuditSideRPCWithTheSameRequestIsNotTheTry).
func TestSideRPCOfALaterInterceptorIsNotTheTry(t *testing.T) {
	leaf := &testsvc.Service{
		GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return &testingv1.GetResponse{}, nil
		},
		PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			return &testingv1.PutResponse{}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	fetchThenFail := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != testingv1.TestService_Get_FullMethodName {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		// The side RPC goes to what lies below this interceptor, as the
		// call itself would.
		_ = invoker(ctx, testingv1.TestService_Put_FullMethodName, &testingv1.PutRequest{}, &testingv1.PutResponse{}, cc)
		return grpcstatus.Error(codes.Unavailable, "auth: no token")
	}
	opts := append(interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1})),
		grpc.WithChainUnaryInterceptor(fetchThenFail))
	client := testingv1.NewTestServiceClient(end.DialT(t, opts...))

	ctx, err := interceptor.StartAttempt(t.Context(), 5, 10*time.Second)
	require.NoError(t, err)
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	require.Equal(t, status.KindUnknown, o.Kind, "the try may have been sent under another name: %v", err)
	require.ErrorContains(t, err, "auth: no token", "the interceptor's own error, not the side RPC's status")
	require.Equal(t, int64(5), snap.Held, "a try that may have been sent holds its grant")
}

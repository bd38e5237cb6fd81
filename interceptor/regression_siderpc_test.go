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
// without sending the call. The call never left the client: it is
// NOT_ADMITTED NOT_SENT and its grant comes back (DESIGN.md §3.5). The side
// RPC's OutHeader and InTrailer must not be booked to the try (found by an
// adversarial review: they were, and the call came back UNKNOWN with its
// grant held).
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
	require.Equal(t, status.KindNotAdmitted, o.Kind, "the call never left the client: %v", err)
	require.Equal(t, status.ReasonNotSent, o.Reason)
	require.Zero(t, snap.Held, "a call never sent spent nothing: its grant comes back")
}

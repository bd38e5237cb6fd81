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
	"google.golang.org/protobuf/types/known/emptypb"
)

// An interceptor below tollgate's that sends the try's very request message
// to an audit method on the same connection was taken for the try by a first
// fix of TestRenamedTryIsMaybeSent, which recognised a renamed try by its
// request: the audit call's trailer (tollgate-spent 0 under strict
// accounting) was booked as the try's, and when the real try then lost its
// response the caller freed a grant the callee still held (DESIGN §3.3;
// found by review). A side RPC's events are never the try's.
func TestAuditSideRPCWithTheSameRequestIsNotTheTry(t *testing.T) {
	// The callee is still working (and could be spending its grant) when the
	// caller stops waiting: it answers only once the test ends, whatever its
	// context says (its own deadline, a hop margin earlier than the caller's,
	// would otherwise race the caller's and sometimes answer in time).
	working := make(chan struct{})
	leafSvc := &testsvc.Service{
		ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			<-working
			return &testingv1.ApplyResponse{}, nil
		},
	}
	leaf := testsvc.StartT(t, testsvc.Bufconn, leafSvc.Register, append(interceptor.ServerOptions(
		interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0)),
		grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
			var m testingv1.ApplyRequest
			if err := st.RecvMsg(&m); err != nil {
				return err
			}
			return st.SendMsg(&emptypb.Empty{})
		}))...)
	audit := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == testingv1.TestService_Apply_FullMethodName {
			// as TestSideRPCOfALaterInterceptorIsNotTheTry's side RPC, but
			// recording the request itself
			if err := inv(ctx, "/audit.v1.Audit/Record", req, new(emptypb.Empty), cc); err != nil {
				return err
			}
		}
		return inv(ctx, method, req, reply, cc, opts...)
	}
	t.Cleanup(func() { close(working) }) // before the server stops (cleanups run last first)
	conn := leaf.DialT(t, append(interceptor.DialOptions(
		interceptor.WithStrictAccounting(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1, PerTryTimeout: 200 * time.Millisecond})),
		grpc.WithChainUnaryInterceptor(audit))...)
	client := testingv1.NewTestServiceClient(conn)
	ctx, err := interceptor.StartAttempt(t.Context(), 5, 10*time.Second)
	require.NoError(t, err)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
	o := status.OutcomeOf(err)
	ledger, _ := budget.FromContext(ctx)
	s := ledger.Snapshot()
	t.Logf("kind=%v reason=%v err=%v ledger=%+v", o.Kind, status.ReasonName(o.Reason), err, s)
	require.NotZero(t, s.Held, "the try's response never came: its grant must be held, not refunded")
}

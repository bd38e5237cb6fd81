package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// statsHandler.TagRPC hid the try's delivery record from any RPC whose
// method differs from the try's (the side-RPC fix). An interceptor below
// tollgate's that routes the call under another method name (a versioned or
// legacy path) was then never seen by the stats handler, and with
// DialOptions every failed try lacked OutHeader and was classified NOT_SENT:
// repeated without a query (found by review). A first fix recognised the
// renamed try by its request pointer, and missed a rename that sends a copy
// (proto.Clone, a v1->v2 conversion), found by a later review. An RPC of
// another method that may have been sent, while the try's own method never
// started, leaves the try maybe sent: UNKNOWN, the handler runs once,
// whatever the rename sends. A side RPC followed by the try itself is left
// to the try's own events (TestAuditSideRPCWithTheSameRequestIsNotTheTry).
func TestRenamedTryIsMaybeSent(t *testing.T) {
	for _, tc := range []struct {
		name string
		send func(req any) any
	}{
		{"the request itself", func(req any) any { return req }},
		{"a copy of the request", func(req any) any { return proto.Clone(req.(proto.Message)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			end := testsvc.StartT(t, testsvc.Bufconn, func(*grpc.Server) {},
				grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
					if m, _ := grpc.MethodFromServerStream(st); m != "/legacy.v0.Ledger/Apply" {
						return grpcstatus.Error(codes.Unimplemented, "no such service") // the owner's query
					}
					runs.Add(1)
					var m testingv1.ApplyRequest
					_ = st.RecvMsg(&m)
					return grpcstatus.Error(codes.Internal, "effect done, then failed")
				}))
			rewrite := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if method != testingv1.TestService_Apply_FullMethodName {
					return inv(ctx, method, req, reply, cc, opts...) // tollgate's own queries keep their names
				}
				return inv(ctx, "/legacy.v0.Ledger/Apply", tc.send(req), reply, cc, opts...)
			}
			opts := append(interceptor.DialOptions(), grpc.WithChainUnaryInterceptor(rewrite)) // below tollgate's
			c := testingv1.NewTestServiceClient(end.DialT(t, opts...))
			_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			o := status.OutcomeOf(err)
			require.Equal(t, int32(1), runs.Load(), "a sent try was classified NOT_SENT and repeated: %v", err)
			require.Equal(t, status.KindUnknown, o.Kind, "the try may have run: its outcome is unknown")
		})
	}
}

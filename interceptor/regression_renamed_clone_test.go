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

// TestRenamedTryIsTheTry's rename forwards the very request pointer. A
// routing interceptor below tollgate's that renames the method and sends a
// copy (proto.Clone, or a v1->v2 conversion) is the try all the same; a
// first fix recognised the try by its request pointer and missed this one,
// which read NOT_SENT and was repeated without a query (found by review).
func TestRenamedTryWithACopiedRequestIsMaybeSent(t *testing.T) {
	var runs atomic.Int32
	end := testsvc.StartT(t, testsvc.Bufconn, func(*grpc.Server) {},
		grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
			if m, _ := grpc.MethodFromServerStream(st); m != "/legacy.v0.Ledger/Apply" {
				return grpcstatus.Error(codes.Unimplemented, "no such service")
			}
			runs.Add(1)
			var m testingv1.ApplyRequest
			_ = st.RecvMsg(&m)
			return grpcstatus.Error(codes.Internal, "effect done, then failed")
		}))
	rewrite := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != testingv1.TestService_Apply_FullMethodName {
			return inv(ctx, method, req, reply, cc, opts...)
		}
		return inv(ctx, "/legacy.v0.Ledger/Apply", proto.Clone(req.(proto.Message)), reply, cc, opts...)
	}
	opts := append(interceptor.DialOptions(), grpc.WithChainUnaryInterceptor(rewrite))
	c := testingv1.NewTestServiceClient(end.DialT(t, opts...))
	_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	o := status.OutcomeOf(err)
	t.Logf("kind=%v reason=%v runs=%d err=%v", o.Kind, status.ReasonName(o.Reason), runs.Load(), err)
	require.Equal(t, int32(1), runs.Load(), "a sent try was classified NOT_SENT and repeated")
	require.NotEqual(t, status.KindNotAdmitted, o.Kind)
}

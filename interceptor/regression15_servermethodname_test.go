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
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// grpc-go serves any method name a grpc.ServiceDesc declares (hand-written
// descriptors, generated code of other IDLs, proxies): "/pkg.Svc/get-item"
// is a valid gRPC path. With an attempt store, tollgate keys the record by
// the method and the key validator (idempotency.ValidateKey) accepts only
// protobuf identifiers, so every call of such a method is refused
// NOT_ADMITTED STORE_UNAVAILABLE, final ("the server cannot key this call's
// record") and the method cannot be served at all, by any caller, trusted or
// not — although nothing in the record key needs the method to be a
// protobuf name (it is an opaque string ≤ 512 bytes to both stores).
func TestRegression15ServerMethodName(t *testing.T) {
	var runs atomic.Int64
	desc := grpc.ServiceDesc{
		ServiceName: "tollgate.testing.v1.Hyphen",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "apply-v2",
			Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := new(testingv1.ApplyRequest)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, req any) (any, error) {
					runs.Add(1)
					return &testingv1.ApplyResponse{Total: 1}, nil
				}
				if icpt == nil {
					return h(ctx, in)
				}
				return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/tollgate.testing.v1.Hyphen/apply-v2"}, h)
			},
		}},
	}
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { s.RegisterService(&desc, struct{}{}) },
		interceptor.ServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0))...)
	conn := end.DialT(t)
	out := new(testingv1.ApplyResponse)
	err := conn.Invoke(t.Context(), "/tollgate.testing.v1.Hyphen/apply-v2", &testingv1.ApplyRequest{Key: "k"}, out)
	o := status.OutcomeOf(err)
	require.NoError(t, err, "refused %v %v final=%v: %v", o.Kind, status.ReasonName(o.Reason), o.Final(), err)
	require.Equal(t, int64(1), runs.Load())
}

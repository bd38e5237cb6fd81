package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A server that recovers panics with an interceptor of its own placed
// outside tollgate's (the usual grpc-ecosystem recovery middleware, first in
// the chain) and does not pass WithRecovery: the handler's panic goes up
// through tollgate's interceptor, which neither recovers it nor finishes the
// record. The panic's answer has gone back (INTERNAL) and the handler has
// ended, but the record reads IN_PROGRESS until the attempt's deadline plus
// the skew: the owner's FenceAttempt polls it for the whole attempt and then
// gets ABANDONED, and a strict caller's grant is never reconciled (ABANDONED
// never moves held units). DESIGN.md §3.7 records a try's end by how it
// ended ("anything else → UNKNOWN"; "a recovered panic is UNKNOWN"):
// tollgate need not recover the panic to record it — a deferred finish
// (UNKNOWN) followed by re-panicking keeps the panic's path unchanged.
func TestRegression15ServerOuterPanic(t *testing.T) {
	store := memoryStore(t)
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		panic("handler bug")
	}}
	outerRecovery := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = grpcstatus.Error(codes.Internal, fmt.Sprint("recovered: ", r))
			}
		}()
		return h(ctx, req)
	})
	opts := append([]grpc.ServerOption{outerRecovery}, interceptor.ServerOptions(interceptor.WithAttemptStore(store),
		interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0))...)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, opts...)
	conn := end.DialT(t)

	id, err := interceptor.StartAttempt(t.Context(), 0, 30*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(id)
	hdr := "a=" + a.ID + ";c=0;t=1;d=" + itoa(a.Deadline.UnixMilli())
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", hdr)
	_, err = testingv1.NewTestServiceClient(conn).Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
	require.Equal(t, codes.Internal, grpcstatus.Code(err), "%v", err)

	rec, err := tollgatev1.NewAttemptServiceClient(conn).GetAttempt(metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID),
		&tollgatev1.GetAttemptRequest{AttemptId: a.ID, Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN.String(), rec.GetState().String(),
		"the handler panicked and its answer was sent, but the record reads %v until %v", rec.GetState(), rec.GetLeaseExpiresAt().AsTime())
}

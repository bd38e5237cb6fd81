package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// expiredCreds is a grpc.PerRPCCredentials whose token cannot be had: it
// answers UNAUTHENTICATED, which grpc-go (gRFC A54) passes to the caller.
type expiredCreds struct{ calls *atomic.Int64 }

func (c expiredCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	c.calls.Add(1)
	return nil, grpcstatus.Error(codes.Unauthenticated, "token expired")
}
func (expiredCreds) RequireTransportSecurity() bool { return false }

// With grpc.PerRPCCredentials that fail with UNAUTHENTICATED, grpc-go
// returns UNAUTHENTICATED once. tollgate classifies every error of a try
// without OutHeader as NOT_SENT whatever its code (status.OutcomeOfCall),
// repeats the call MaxTries times (the credentials are asked three
// times) and returns UNAVAILABLE: status.Code and status.FromError no longer
// show the caller that its credentials failed, and any UNAVAILABLE retry
// above repeats the hopeless call again. The same happens to a definite
// error an interceptor chained below tollgate returns without sending
// (INVALID_ARGUMENT from a request validator).
func TestRegression15ClientCredsNotSent(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	var calls atomic.Int64
	_, err := client.Get(t.Context(), &testingv1.GetRequest{}, grpc.PerRPCCredentials(expiredCreds{&calls}))
	require.Equal(t, codes.Unauthenticated, grpcstatus.Code(err), "the credentials' code, as grpc-go returns it: %v", err)
	require.Equal(t, int64(1), calls.Load(), "a definite local failure is not repeated")

	validate := func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
		return grpcstatus.Error(codes.InvalidArgument, "request invalid")
	}
	inner := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithChainUnaryInterceptor(validate))...))
	_, err = inner.Get(t.Context(), &testingv1.GetRequest{})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "an inner interceptor's definite error: %v", err)
}

package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// TestPlainInterceptorsInOwnChains: the plain-interceptor constructors work
// in a server's and a client's own chains, and with StatsHandler installed
// the client still tells a try never sent from one that may have been.
func TestPlainInterceptorsInOwnChains(t *testing.T) {
	su, ss, err := interceptor.NewServerInterceptors(interceptor.WithTrustedPeer(interceptor.TrustAll))
	require.NoError(t, err)
	var order []string
	outer := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		_, ok := interceptor.AttemptFromContext(ctx)
		order = append(order, "outer sees attempt: "+map[bool]string{true: "yes", false: "no"}[ok])
		return h(ctx, req)
	}
	var seen interceptor.Attempt
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		seen, _ = interceptor.AttemptFromContext(ctx)
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, grpc.ChainUnaryInterceptor(outer, su), grpc.ChainStreamInterceptor(ss))

	cu, cs, err := interceptor.NewClientInterceptors(interceptor.WithAllowance(3))
	require.NoError(t, err)
	client := testingv1.NewTestServiceClient(end.DialT(t,
		grpc.WithChainUnaryInterceptor(cu), grpc.WithChainStreamInterceptor(cs),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))

	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	require.NotEmpty(t, seen.ID)
	require.False(t, seen.Origin, "the client's attempt travelled")
	require.Equal(t, []string{"outer sees attempt: no"}, order, "the server's own interceptor runs first, as chained")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "a try that never left is NOT_SENT: %v", err)
	require.Equal(t, status.ReasonNotSent, o.Reason)

	_, _, err = interceptor.NewClientInterceptors(interceptor.WithAllowance(-1))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption)
	_, _, err = interceptor.NewServerInterceptors(interceptor.WithClockSkew(-1))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption)
}

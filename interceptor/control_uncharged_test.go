package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// TestHandlersHealthCallIsNotCharged checks the README's departure from
// DESIGN.md §3.3: a health call a handler makes below the origin is passed
// through with no tollgate header and no unit, so it succeeds when the
// attempt's allowance has no unit free, and leaves the ledger as it was;
// the handler's data call on the same conn is refused ALLOWANCE_EXHAUSTED.
// (Review r12: no test checked the claim.)
func TestHandlersHealthCallIsNotCharged(t *testing.T) {
	var headers atomic.Int64 // requests that reached the backend with a tollgate header
	seeHeader := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("tollgate")) > 0 {
			headers.Add(1)
		}
		return h(ctx, req)
	}
	backend := &testsvc.Service{GetFunc: okGet}
	backendEnd := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		backend.Register(s)
		healthpb.RegisterHealthServer(s, health.NewServer())
	}, grpc.ChainUnaryInterceptor(seeHeader))
	conn := backendEnd.DialT(t, interceptor.DialOptions()...)
	healthClient := healthpb.NewHealthClient(conn)
	dataClient := testingv1.NewTestServiceClient(conn)

	var before, after budget.Snapshot
	var healthErr, dataErr error
	var healthStatus healthpb.HealthCheckResponse_ServingStatus
	front := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		ledger, _ := budget.FromContext(ctx)
		before = ledger.Snapshot()
		var resp *healthpb.HealthCheckResponse
		resp, healthErr = healthClient.Check(ctx, &healthpb.HealthCheckRequest{})
		healthStatus = resp.GetStatus()
		after = ledger.Snapshot()
		_, dataErr = dataClient.Get(ctx, &testingv1.GetRequest{})
		return &testingv1.GetResponse{}, nil
	}}
	frontEnd := testsvc.StartT(t, testsvc.Bufconn, front.Register,
		interceptor.ServerOptions(interceptor.WithTrustedPeer(interceptor.TrustAll))...)
	origin := testingv1.NewTestServiceClient(frontEnd.DialT(t, interceptor.DialOptions(interceptor.WithAllowance(0))...))

	_, err := origin.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	require.Zero(t, before.Free, "the handler has no unit to spend")
	require.NoError(t, healthErr, "a health call needs no unit")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, healthStatus)
	require.Equal(t, before, after, "the health call left the ledger as it was")
	require.Equal(t, status.ReasonAllowanceExhausted, status.OutcomeOf(dataErr).Reason, "a data call does need one: %v", dataErr)
	require.Zero(t, headers.Load(), "the health call carried no tollgate header")
	require.Zero(t, backend.Calls("Get"), "the data call was refused locally")
}

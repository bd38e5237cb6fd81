package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// TestR17hQueryThatNeverLeftIsNotCountedAsSent: tollgate.client.queries
// counts "resolution queries sent" (README, its description), as
// tollgate.client.tries counts only tries that may have been sent. A query
// that an interceptor chained inside tollgate's failed before it left the
// client (no OutHeader: provably never sent) reached no callee; it still
// gets its tollgate.attempt.query event (QUERY_FAILED), but it is no query
// sent, and neither the counter nor the span's tollgate.queries may count
// it. The resolution that sent none gives its retry-budget token back for
// the same reason (owner.resolve: unsent).
func TestR17hQueryThatNeverLeftIsNotCountedAsSent(t *testing.T) {
	tp, spans := testTracer(t)
	mp, reader := testMeter(t)
	ledger := newLedger(nil)
	lose := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err == nil && info.FullMethod == testingv1.TestService_Apply_FullMethodName {
			return nil, grpcstatus.Error(codes.Internal, "proxy: upstream reset") // after the effect
		}
		return resp, err
	})
	end := recordedServer(t, &ledger.Service, memoryStore(t), lose)
	// Inside tollgate's interceptor: the query is refused before it is sent.
	inner := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == tollgatev1.AttemptService_FenceAttempt_FullMethodName {
			return grpcstatus.Error(codes.Unavailable, "local: no route to the attempt service")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	opts := append(interceptor.DialOptions(
		interceptor.WithClientTracerProvider(tp), interceptor.WithClientMeterProvider(mp),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2})), inner)
	client := testingv1.NewTestServiceClient(end.DialT(t, opts...))

	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	require.Equal(t, int64(1), ledger.effects.Load())

	var states []string
	got := callSpans(spans)
	require.Len(t, got, 1)
	for _, e := range got[0].Events {
		if e.Name == "tollgate.attempt.query" {
			v, _ := attr(e.Attributes, "state")
			states = append(states, v.AsString())
		}
	}
	require.Equal(t, []string{"QUERY_FAILED"}, states, "the query's event says it failed")
	if v, ok := attr(got[0].Attributes, "tollgate.queries"); ok {
		require.Zero(t, v.AsInt64(), "tollgate.queries counts the queries sent: none was")
	}
	rm := collect(t, reader)
	require.Zero(t, counter(rm, "tollgate.client.queries"), "no query was sent")
}

package interceptor_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestRegression13SpendEventsOfNeverSentTriesAreNotReturned: a middle tier (below the
// origin) calls a dependency it cannot reach, so every try fails before its
// request leaves the client (no OutHeader: NOT_SENT). The ledger takes a
// unit for each try and gives it back (Unsend), so nothing was spent and the
// dependency received nothing; but each try's tollgate.allowance.spend event
// was recorded with units=1 before the try was sent, and no event or
// attribute corrects it. The spend events then add up to units the
// dependency never received (TestTelemetryOneAttemptOnEverySpanAndSpendAddsUp
// states that they must add up to the calls it received), and disagree with
// the span's own tollgate.allowance.spent.
func TestRegression13SpendEventsOfNeverSentTriesAreNotReturned(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	// The dependency is unreachable.
	dep := unreachable(t, interceptor.WithClientTracerProvider(tp))

	var depErr error
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		_, depErr = dep.Get(ctx, r)
		return &testingv1.GetResponse{Value: "v"}, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithAllowance(8), interceptor.WithAttemptTimeout(10*time.Second))...))

	_, err := origin.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	require.Error(t, depErr)
	require.Equal(t, status.ReasonNotSent, status.OutcomeOf(depErr).Reason, "precondition: the dependency's tries were never sent: %v", depErr)

	var midSpan *tracetest.SpanStub
	for i, s := range spans.GetSpans() {
		if s.Name == "tollgate.call" {
			midSpan = &spans.GetSpans()[i]
		}
	}
	require.NotNil(t, midSpan, "the middle tier's tollgate.call span")
	var units, tries int64
	for _, e := range midSpan.Events {
		if e.Name == "tollgate.allowance.spend" {
			tries++
			u, ok := attr(e.Attributes, "units")
			require.True(t, ok)
			units += u.AsInt64()
		}
	}
	spent, ok := attr(midSpan.Attributes, "tollgate.allowance.spent")
	require.True(t, ok)
	require.Equal(t, int64(0), spent.AsInt64(), "precondition: the ledger spent nothing (every unit came back)")
	require.Equal(t, int64(3), tries, "precondition: three tries were prepared")
	require.Equal(t, spent.AsInt64(), units,
		"the spend events of tries that were never sent add up to %d units, yet the dependency received nothing and the span says %d were spent",
		units, spent.AsInt64())
}

// TestRegression13NeverSentTriesCountedAsSentTries: tollgate.client.tries is
// documented as "Tries sent by tollgate's client interceptor" and client.record
// says "Local refusals sent nothing and are not counted". A try that grpc-go
// failed before its request left the client (no OutHeader: NOT_SENT, which
// the client itself proves) sent nothing either, yet each one is counted as
// a sent try (outcome not_admitted), indistinguishable from a server's
// refusal.
func TestRegression13NeverSentTriesCountedAsSentTries(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	_, err := unreachable(t, interceptor.WithClientMeterProvider(mp)).Get(t.Context(), &testingv1.GetRequest{})
	require.Equal(t, status.ReasonNotSent, status.OutcomeOf(err).Reason, "precondition: never sent: %v", err)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, int64(0), counter(rm, "tollgate.client.tries"),
		"three tries that provably never left the client are counted as sent tries")
}

// unreachable returns a tollgate client (three tries, no retry budget, and
// opts) of a server no connection reaches: grpc-go fails each of its RPCs
// (not wait-for-ready) before any header is sent.
func unreachable(t *testing.T, opts ...interceptor.ClientOption) testingv1.TestServiceClient {
	conn, err := grpc.NewClient("passthrough:///unreachable",
		append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
				return nil, errors.New("unreachable")
			}),
		}, interceptor.DialOptions(append([]interceptor.ClientOption{
			interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
			interceptor.WithoutRetryBudget(),
		}, opts...)...)...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return testingv1.NewTestServiceClient(conn)
}

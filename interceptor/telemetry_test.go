package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

func attr(attrs []attribute.KeyValue, key string) (attribute.Value, bool) {
	for _, kv := range attrs {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// testTracer is a tracer provider that exports each span, as it ends, to
// the returned in-memory exporter; it is shut down when the test ends.
func testTracer(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, spans
}

// testMeter is a meter provider read by the returned manual reader; it is
// shut down when the test ends.
func testMeter(t *testing.T) (*sdkmetric.MeterProvider, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return mp, reader
}

// TestTelemetryOneAttemptOnEverySpanAndSpendAddsUp: a three-hop call whose
// dependency refuses, so both tiers repeat. Every tollgate.call span carries
// the one attempt ID, and the units of the tollgate.allowance.spend events
// add up to the calls the dependency received.
func TestTelemetryOneAttemptOnEverySpanAndSpendAddsUp(t *testing.T) {
	tp, spans := testTracer(t)
	mp, reader := testMeter(t)

	fast := interceptor.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	origin, mid := fast, fast
	origin.MaxTries, mid.MaxTries = 3, 2
	refuse := func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull)
	}
	tr := newTiers(t,
		[]interceptor.ClientOption{interceptor.WithAllowance(4), interceptor.WithRetry(origin),
			interceptor.WithClientTracerProvider(tp), interceptor.WithClientMeterProvider(mp)},
		[]interceptor.ClientOption{interceptor.WithRetry(mid),
			interceptor.WithClientTracerProvider(tp), interceptor.WithClientMeterProvider(mp)},
		refuse)
	_, err := tr.origin.Get(t.Context(), &testingv1.GetRequest{})
	require.Equal(t, status.ReasonAllowanceExhausted, status.OutcomeOf(err).Reason)

	var ids = map[string]bool{}
	var spent, calls int64
	for _, s := range spans.GetSpans() {
		if s.Name != "tollgate.call" {
			continue
		}
		calls++
		id, ok := attr(s.Attributes, "tollgate.attempt.id")
		require.True(t, ok)
		ids[id.AsString()] = true
		for _, e := range s.Events {
			if e.Name == "tollgate.allowance.spend" {
				u, ok := attr(e.Attributes, "units")
				require.True(t, ok)
				spent += u.AsInt64()
			}
		}
	}
	require.Len(t, ids, 1, "one attempt ID on every span")
	require.Equal(t, int64(3), calls, "one span for the origin's call and one per call the frontend made")
	require.Equal(t, tr.dep.Calls("Get"), spent, "spend events add up to the calls the dependency received")
	require.Equal(t, int64(4), spent)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, int64(1), counter(rm, "tollgate.allowance.exhausted"))
	require.Equal(t, int64(2+4), counter(rm, "tollgate.client.tries"), "2 origin tries and 4 frontend tries were sent")
	require.Equal(t, tr.dep.Calls("Get"), counter(rm, "tollgate.allowance.spent"),
		"the spent metric counts the units the dependency's calls spent, as the events do")
	require.Zero(t, counter(rm, "tollgate.allowance.held"), "every refusal proved that its callee spent nothing")
}

// TestHeldGrantIsCounted: the frontend's call to the dependency ends with a
// plain UNAVAILABLE and no tollgate-spent (the dependency does not speak
// tollgate, as a proxy answering on its own), which proves nothing of what
// was spent below: the grant the frontend lent it is held, and
// tollgate.allowance.held counts its units (before the metric, a held grant
// showed only as units missing from the ledger).
func TestHeldGrantIsCounted(t *testing.T) {
	tp, spans := testTracer(t)
	mp, reader := testMeter(t)
	once := interceptor.RetryPolicy{MaxTries: 1}
	dep := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, grpcstatus.Error(codes.Unavailable, "lost")
	}}
	depClient := testingv1.NewTestServiceClient(testsvc.StartT(t, testsvc.Bufconn, dep.Register).DialT(t,
		interceptor.DialOptions(interceptor.WithRetry(once),
			interceptor.WithClientTracerProvider(tp), interceptor.WithClientMeterProvider(mp))...))
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return depClient.Get(ctx, r)
	}}
	origin := testingv1.NewTestServiceClient(testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...).DialT(t,
		interceptor.DialOptions(interceptor.WithAllowance(4), interceptor.WithRetry(once))...))
	_, err := origin.Get(t.Context(), &testingv1.GetRequest{})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind)

	var granted int64
	for _, s := range spans.GetSpans() {
		for _, e := range s.Events {
			if e.Name == "tollgate.allowance.spend" {
				g, ok := attr(e.Attributes, "tollgate.allowance.granted")
				require.True(t, ok)
				granted += g.AsInt64()
			}
		}
	}
	require.Equal(t, int64(3), granted, "the frontend took 1 of its 4 units and lent the dependency the other 3")
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, int64(1), counter(rm, "tollgate.allowance.spent"))
	require.Equal(t, granted, counter(rm, "tollgate.allowance.held"), "the whole grant is held")
}

func counter(rm metricdata.ResourceMetrics, name string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

func TestMalformedHeaderIsCounted(t *testing.T) {
	mp, reader := testMeter(t)
	svc := &testsvc.Service{GetFunc: okGet}
	untrusted := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		interceptor.ServerOptions(interceptor.WithServerMeterProvider(mp))...)
	client := testingv1.NewTestServiceClient(untrusted.DialT(t))
	for _, v := range []string{"a=1;a=2", "a=x y", "t=1", "a=x;u=-1"} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", v)
		_, err := client.Get(ctx, &testingv1.GetRequest{})
		require.NoError(t, err, "an untrusted peer's malformed header is ignored: %q", v)
	}
	two := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x", "tollgate", "a=y")
	_, err := client.Get(two, &testingv1.GetRequest{})
	require.Equal(t, codes.OK, grpcstatus.Code(err))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, int64(5), counter(rm, "tollgate.metadata.malformed"))
}

// TestAdmissionEventOnTheServerSpan: with a recording server span in the
// request's context (as otelgrpc's server handler makes), each admission
// decision is a tollgate.admission event with its class.
func TestAdmissionEventOnTheServerSpan(t *testing.T) {
	tp, spans := testTracer(t)
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 2, QueueItems: 2}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	withSpan := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, span := tp.Tracer("test").Start(ctx, info.FullMethod)
		defer span.End()
		return h(ctx, req)
	})
	svc := &testsvc.Service{GetFunc: okGet}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, append([]grpc.ServerOption{withSpan}, serverOpts(interceptor.WithAdmission(ctrl))...)...)
	_, err = testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...)).Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	var found bool
	for _, s := range spans.GetSpans() {
		for _, e := range s.Events {
			if e.Name == "tollgate.admission" {
				found = true
				d, _ := attr(e.Attributes, "decision")
				c, _ := attr(e.Attributes, "class")
				q, ok := attr(e.Attributes, "queued_ahead")
				require.Equal(t, "admitted", d.AsString())
				require.Equal(t, "work", c.AsString())
				require.True(t, ok)
				require.Zero(t, q.AsInt64())
			}
		}
	}
	require.True(t, found)
}

// TestLateTryIsCountedAsADeadlineMiss: a try that comes after its attempt's
// deadline is refused DEADLINE_EXPIRED by the interceptor before admission,
// or by the store's Begin for a recorded call, so the controller's
// tollgate.deadline.misses never saw it; such tries went into no metric
// (the decision is in neither the controller's decisions nor its misses).
// They are now counted in tollgate.deadline.misses{stage=arrival}.
func TestLateTryIsCountedAsADeadlineMiss(t *testing.T) {
	mp, reader := testMeter(t)
	ledger := newLedger(nil)
	ledger.GetFunc = okGet
	end := recordedServer(t, &ledger.Service, memoryStore(t), interceptor.ServerOptions(
		interceptor.WithServerMeterProvider(mp), interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0))...)
	client := testingv1.NewTestServiceClient(end.DialT(t)) // a plain client: the header is the test's
	late := func() context.Context {
		id, err := uuid.NewV7()
		require.NoError(t, err)
		v := fmt.Sprintf("a=%s;d=%d", id, time.Now().Add(-time.Second).UnixMilli())
		return metadata.AppendToOutgoingContext(t.Context(), "tollgate", v)
	}
	_, err := client.Get(late(), &testingv1.GetRequest{})
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason, "%v", err)
	_, err = client.Apply(late(), &testingv1.ApplyRequest{Key: "k", Amount: 1})
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason, "%v", err)
	require.Zero(t, ledger.Calls("Get")+ledger.Calls("Apply"))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	var arrival int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "tollgate.deadline.misses" {
				for _, dp := range sum.DataPoints {
					if v, _ := dp.Attributes.Value("stage"); v.AsString() == "arrival" {
						arrival += dp.Value
					}
				}
			}
		}
	}
	require.Equal(t, int64(2), arrival, "each late try is one miss on arrival")
}

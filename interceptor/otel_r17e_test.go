package interceptor_test

// A fresh-eyes review of tollgate's OpenTelemetry signals, read with the
// real SDK (sdk/trace's in-memory exporter, sdk/metric's ManualReader):
// each test names the signal that was missing or wrong.

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// callSpans returns the tollgate.call spans the exporter holds.
func callSpans(spans *tracetest.InMemoryExporter) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans.GetSpans() {
		if s.Name == "tollgate.call" {
			out = append(out, s)
		}
	}
	return out
}

// counterWhere sums the data points of counter name whose attribute key is
// value.
func counterWhere(rm metricdata.ResourceMetrics, name, key, value string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					if v, _ := dp.Attributes.Value(attribute.Key(key)); v.AsString() == value {
						n += dp.Value
					}
				}
			}
		}
	}
	return n
}

func collect(t *testing.T, reader interface {
	Collect(context.Context, *metricdata.ResourceMetrics) error
}) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	return rm
}

// TestCallSpanStatusAndMethod: a tollgate.call span that ends NOT_ADMITTED
// has span status Error with a short description, as an OTel RPC client
// span has for a failed call (the span status was never set, so a trace
// backend showed every refused call as fine); one that ends OK leaves the
// status Unset. Both name their method with the RPC semantic conventions'
// rpc.system, rpc.service and rpc.method (the span named no method, so a
// call refused locally, with no RPC span under it, could not be told).
func TestCallSpanStatusAndMethod(t *testing.T) {
	tp, spans := testTracer(t)
	var refuse atomic.Bool
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if refuse.Load() {
			return nil, status.NotAdmitted(status.ReasonQueueFull)
		}
		return okGet(ctx, r)
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientTracerProvider(tp), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	refuse.Store(true)
	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "%v", err)

	got := callSpans(spans)
	require.Len(t, got, 2)
	for _, s := range got {
		for key, want := range map[string]string{"rpc.system": "grpc", "rpc.service": "tollgate.testing.v1.TestService", "rpc.method": "Get"} {
			v, ok := attr(s.Attributes, key)
			require.True(t, ok, "%s missing", key)
			require.Equal(t, want, v.AsString(), key)
		}
	}
	require.Equal(t, otelcodes.Unset, got[0].Status.Code, "an OK call leaves the status Unset")
	require.Equal(t, otelcodes.Error, got[1].Status.Code, "a refused call is an error")
	require.Equal(t, "NOT_ADMITTED QUEUE_FULL", got[1].Status.Description)
}

// TestDeadlineMissesDescriptionsAgree: tollgate.deadline.misses is
// registered by the server interceptor and by the admission controller in
// their own scopes; an exporter that merges them by name (Prometheus keeps
// one help text) must find them identical, which the interceptor's comment
// promised and its description broke.
func TestDeadlineMissesDescriptionsAgree(t *testing.T) {
	mp, reader := testMeter(t)
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 1}),
		admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	// A request that arrives expired: admission's own miss.
	_, _, err = ctrl.AdmitDecision(t.Context(), admission.Request{Method: "/x.Y/Z", Deadline: time.Now().Add(-time.Second)})
	require.Error(t, err)
	// A late try: the interceptor's miss on arrival.
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{GetFunc: okGet}).Register,
		serverOpts(interceptor.WithServerMeterProvider(mp))...)
	id, err := uuid.NewV7()
	require.NoError(t, err)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+id.String()+";d="+itoa(time.Now().Add(-time.Second).UnixMilli()))
	_, err = testingv1.NewTestServiceClient(end.DialT(t)).Get(ctx, &testingv1.GetRequest{})
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason, "%v", err)

	rm := collect(t, reader)
	var found []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "tollgate.deadline.misses" {
				found = append(found, m)
			}
		}
	}
	require.Len(t, found, 2, "one instrument per scope")
	require.Equal(t, found[0].Unit, found[1].Unit)
	require.Equal(t, found[0].Description, found[1].Description)
}

// TestEventAttributesOfRetryAndQuery: the tollgate.retry event names its
// try tollgate.try, as the spend and query events do (it said `try`); a
// query that failed says QUERY_FAILED and carries the query's gRPC code
// (rpc.grpc.status_code), which it did not; and every query is counted in
// tollgate.client.queries{state}, which nothing counted.
func TestEventAttributesOfRetryAndQuery(t *testing.T) {
	tp, spans := testTracer(t)
	mp, reader := testMeter(t)
	ledger := newLedger(nil)
	var dropApply, failFence atomic.Bool
	faults := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == tollgatev1.AttemptService_FenceAttempt_FullMethodName && failFence.Load() {
			return nil, grpcstatus.Error(codes.Unavailable, "attempt service unreachable")
		}
		resp, err := h(ctx, req)
		if info.FullMethod == testingv1.TestService_Apply_FullMethodName && dropApply.CompareAndSwap(true, false) {
			return nil, grpcstatus.Error(codes.Internal, "proxy: upstream reset") // after the effect
		}
		return resp, err
	})
	var gets atomic.Int32
	ledger.GetFunc = func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if gets.Add(1) == 1 {
			return nil, status.NotAdmitted(status.ReasonQueueFull) // a refused first try, then a repeat
		}
		return okGet(ctx, r)
	}
	end := recordedServer(t, &ledger.Service, memoryStore(t), faults)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientTracerProvider(tp), interceptor.WithClientMeterProvider(mp),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))

	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	// A lost answer, resolved by a query: SUCCEEDED.
	dropApply.Store(true)
	_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.NoError(t, err)
	// A lost answer whose query fails: QUERY_FAILED, with the query's code.
	dropApply.Store(true)
	failFence.Store(true)
	_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)

	var retries, states []string
	var failedCode int64 = -1
	for _, s := range callSpans(spans) {
		for _, e := range s.Events {
			switch e.Name {
			case "tollgate.retry":
				_, old := attr(e.Attributes, "try")
				require.False(t, old, "the retry event's try is tollgate.try")
				v, ok := attr(e.Attributes, "tollgate.try")
				require.True(t, ok)
				retries = append(retries, itoa(v.AsInt64()))
			case "tollgate.attempt.query":
				v, _ := attr(e.Attributes, "state")
				states = append(states, v.AsString())
				if c, ok := attr(e.Attributes, "rpc.grpc.status_code"); ok {
					failedCode = c.AsInt64()
				}
			}
		}
	}
	require.Equal(t, []string{"2"}, retries)
	require.Equal(t, []string{"SUCCEEDED", "QUERY_FAILED"}, states)
	require.Equal(t, int64(codes.Unavailable), failedCode, "the failed query's code")

	rm := collect(t, reader)
	require.Equal(t, int64(1), counterWhere(rm, "tollgate.client.queries", "state", "SUCCEEDED"))
	require.Equal(t, int64(1), counterWhere(rm, "tollgate.client.queries", "state", "QUERY_FAILED"))
	require.Equal(t, int64(2), counter(rm, "tollgate.client.queries"))
}

// TestHeldAndReconciledAddUp: two calls under one origin attempt lend their
// grants and lose their answers, so both grants are held. The first call's
// query finds a finished record, which gives its grant back; the second's
// query fails, so its grant stays held. tollgate.allowance.held minus the
// new tollgate.allowance.reconciled is what the ledger still holds (held
// only ever went up, so the real loss could not be computed), and each
// tollgate.call span says what its ledger held when it ended
// (tollgate.allowance.held), so that spent − held is what the trace's spend
// events and finished records account for.
func TestHeldAndReconciledAddUp(t *testing.T) {
	tp, spans := testTracer(t)
	mp, reader := testMeter(t)
	ledger := newLedger(nil)
	var failFence atomic.Bool
	faults := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == tollgatev1.AttemptService_FenceAttempt_FullMethodName && failFence.Load() {
			return nil, grpcstatus.Error(codes.Unavailable, "attempt service unreachable")
		}
		resp, err := h(ctx, req)
		if err != nil || info.FullMethod != testingv1.TestService_Apply_FullMethodName {
			return resp, err
		}
		return nil, grpcstatus.Error(codes.Internal, "proxy: upstream reset") // every answer is lost, after the effect
	})
	end := recordedServer(t, &ledger.Service, memoryStore(t), faults)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientTracerProvider(tp), interceptor.WithClientMeterProvider(mp),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.NoError(t, err, "the first call is resolved from its record")
	failFence.Store(true)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)

	l, _ := budget.FromContext(ctx)
	snap := l.Snapshot()
	require.Equal(t, int64(4), snap.Held, "the second call's grant stays held: %+v", snap)
	rm := collect(t, reader)
	require.Equal(t, int64(8), counter(rm, "tollgate.allowance.held"), "both grants were held")
	require.Equal(t, int64(4), counter(rm, "tollgate.allowance.reconciled"), "the first was given back by its record")
	require.Equal(t, snap.Held, counter(rm, "tollgate.allowance.held")-counter(rm, "tollgate.allowance.reconciled"))

	got := callSpans(spans)
	require.Len(t, got, 2)
	var held []int64
	for _, s := range got {
		v, ok := attr(s.Attributes, "tollgate.allowance.held")
		require.True(t, ok, "the call span says what its ledger holds")
		held = append(held, v.AsInt64())
	}
	require.Equal(t, []int64{0, 4}, held)
}

// TestServerRefusalAfterAdmissionIsCountedAndNamed: a try admitted by the
// controller and then refused by the interceptor (its store cannot vouch
// for the attempt: ATTEMPT_UNVERIFIABLE) was counted in no metric, and the
// request's span said only decision=admitted. It is now counted in
// tollgate.server.refusals{reason} and a tollgate.refusal event follows the
// admission event.
func TestServerRefusalAfterAdmissionIsCountedAndNamed(t *testing.T) {
	tp, spans := testTracer(t)
	mp, reader := testMeter(t)
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 2, QueueItems: 2}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	withSpan := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, span := tp.Tracer("test").Start(ctx, info.FullMethod)
		defer span.End()
		return h(ctx, req)
	})
	ledger := newLedger(nil)
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, append([]grpc.ServerOption{withSpan}, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(store),
		interceptor.WithServerMeterProvider(mp))...)...)
	// An attempt minted an hour before the store began retaining.
	id, err := uuid.NewV7()
	require.NoError(t, err)
	ms := time.Now().Add(-time.Hour).UnixMilli()
	for i := range 6 {
		id[i] = byte(ms >> (8 * (5 - i)))
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+id.String()+";t=2;d="+itoa(time.Now().Add(5*time.Second).UnixMilli()))
	_, err = testingv1.NewTestServiceClient(end.DialT(t)).Apply(ctx, &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.Equal(t, status.ReasonAttemptUnverifiable, status.OutcomeOf(err).Reason, "%v", err)
	require.Zero(t, ledger.effects.Load())

	rm := collect(t, reader)
	require.Equal(t, int64(1), counterWhere(rm, "tollgate.server.refusals", "reason", "ATTEMPT_UNVERIFIABLE"))
	require.Equal(t, int64(1), counter(rm, "tollgate.server.refusals"))
	var names []string
	for _, s := range spans.GetSpans() {
		for _, e := range s.Events {
			v, _ := attr(e.Attributes, "decision")
			if e.Name == "tollgate.refusal" {
				v, _ = attr(e.Attributes, "reason")
			}
			names = append(names, e.Name+"="+v.AsString())
		}
	}
	require.Equal(t, []string{"tollgate.admission=admitted", "tollgate.refusal=ATTEMPT_UNVERIFIABLE"}, names)
}

// TestQueryEventsAreCappedPerCall: an owner that polls an IN_PROGRESS
// record many times added one tollgate.attempt.query event per poll, past
// the SDK's default limit of 128 events per span (which then drops the
// newest: the answer). Now the first 16 queries and the last one have an
// event, and the span's tollgate.queries counts them all.
func TestQueryEventsAreCappedPerCall(t *testing.T) {
	tp, spans := testTracer(t)
	const polls = 40
	var fences atomic.Int32
	release := make(chan struct{})
	var once sync.Once
	count := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == tollgatev1.AttemptService_FenceAttempt_FullMethodName && fences.Add(1) >= polls {
			once.Do(func() { close(release) })
		}
		return h(ctx, req)
	})
	ledger := newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
		select { // the effect happened; the answer waits for the owner's polls
		case <-release:
		case <-ctx.Done():
		}
	})
	end := recordedServer(t, &ledger.Service, memoryStore(t), count)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientTracerProvider(tp), interceptor.WithAttemptTimeout(20*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, PerTryTimeout: 20 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.NoError(t, err)

	got := callSpans(spans)
	require.Len(t, got, 1)
	var states []string
	for _, e := range got[0].Events {
		if e.Name == "tollgate.attempt.query" {
			v, _ := attr(e.Attributes, "state")
			states = append(states, v.AsString())
		}
	}
	sent := int64(fences.Load())
	require.GreaterOrEqual(t, sent, int64(polls))
	require.Len(t, states, 17, "the first 16 queries and the last")
	require.Equal(t, "SUCCEEDED", states[len(states)-1], "the answer the owner acted on is kept")
	require.Equal(t, strings.Repeat("IN_PROGRESS ", 16), strings.Join(states[:16], " ")+" ")
	q, ok := attr(got[0].Attributes, "tollgate.queries")
	require.True(t, ok)
	require.Equal(t, sent, q.AsInt64(), "the span counts every query")
}

// downStore is a memory store whose Begin fails, as a store that cannot be
// reached does.
type downStore struct{ *idempotency.MemoryStore }

func (downStore) Begin(context.Context, idempotency.BeginRequest) (idempotency.BeginResult, error) {
	return idempotency.BeginResult{}, errStoreDown
}

var errStoreDown = grpcstatus.Error(codes.Unavailable, "store: connection refused")

// TestStoreUnavailableIsCountedAsARefusal: a try admitted and then refused
// STORE_UNAVAILABLE because the store failed is counted in
// tollgate.server.refusals{reason=STORE_UNAVAILABLE} (written with the fix,
// beside the ATTEMPT_UNVERIFIABLE test above, as the other refusal the
// review named); a try answered from its finished record is not a refusal.
func TestStoreUnavailableIsCountedAsARefusal(t *testing.T) {
	mp, reader := testMeter(t)
	ledger := newLedger(nil)
	var down atomic.Bool
	store := memoryStore(t)
	var s idempotency.Store = store
	failing := downStore{store}
	end := testsvc.StartT(t, testsvc.Bufconn, ledger.Register, serverOpts(
		interceptor.WithAttemptStore(storeSwitch{Store: s, ok: s, down: failing, isDown: &down}), interceptor.WithServerMeterProvider(mp))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	id, err := uuid.NewV7()
	require.NoError(t, err)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+id.String()+";d="+itoa(time.Now().Add(5*time.Second).UnixMilli()))
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.NoError(t, err)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.NoError(t, err, "answered from the finished record")
	down.Store(true)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.Equal(t, status.ReasonStoreUnavailable, status.OutcomeOf(err).Reason, "%v", err)

	rm := collect(t, reader)
	require.Equal(t, int64(1), counterWhere(rm, "tollgate.server.refusals", "reason", "STORE_UNAVAILABLE"))
	require.Equal(t, int64(1), counter(rm, "tollgate.server.refusals"), "a replay is no refusal")
}

// storeSwitch is ok's store until isDown, then down's.
type storeSwitch struct {
	idempotency.Store
	ok, down idempotency.Store
	isDown   *atomic.Bool
}

func (s storeSwitch) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	if s.isDown.Load() {
		return s.down.Begin(ctx, req)
	}
	return s.ok.Begin(ctx, req)
}

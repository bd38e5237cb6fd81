package interceptor_test

// Telemetry on every path a call can end by: written by a review of the
// OpenTelemetry instrumentation (DESIGN.md §5, the README's Observability),
// which found one defect (the unary panic below) and kept the rest as
// guards of the requirement that one attempt ID is on every span and
// the spend events add up to what the dependency received.

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// endCounter wraps the SDK's provider and counts End calls per span, which
// the SDK itself hides (a second End is ignored).
type endCounter struct {
	trace.TracerProvider
	mu    sync.Mutex
	ends  map[trace.SpanID]int
	names map[trace.SpanID]string
}

type countingTracer struct {
	trace.Tracer
	c *endCounter
}

type countingSpan struct {
	trace.Span
	c *endCounter
}

func (c *endCounter) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return countingTracer{c.TracerProvider.Tracer(name, opts...), c}
}

func (t countingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx, s := t.Tracer.Start(ctx, name, opts...)
	t.c.mu.Lock()
	t.c.ends[s.SpanContext().SpanID()] = 0
	t.c.names[s.SpanContext().SpanID()] = name
	t.c.mu.Unlock()
	cs := countingSpan{s, t.c}
	return trace.ContextWithSpan(ctx, cs), cs
}

func (s countingSpan) End(opts ...trace.SpanEndOption) {
	s.c.mu.Lock()
	s.c.ends[s.SpanContext().SpanID()]++
	s.c.mu.Unlock()
	s.Span.End(opts...)
}

func (c *endCounter) check(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, n := range c.ends {
			if n != 1 {
				return false
			}
		}
		return true
	}, 2*time.Second, 10*time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range c.ends {
		require.Equal(t, 1, n, "span %s (%s) ends exactly once", id, c.names[id])
	}
}

func newEndCounter(t *testing.T) (*endCounter, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &endCounter{TracerProvider: tp, ends: map[trace.SpanID]int{}, names: map[trace.SpanID]string{}}, rec
}

// Every tollgate.call span of a stream ends exactly once, on each of the
// ways a stream ends: read to its end, refused before its first try,
// abandoned by its caller's context, cut by its ClientConn's close.
func TestStreamSpansEndExactlyOnce(t *testing.T) {
	ec, _ := newEndCounter(t)
	svc := &testsvc.Service{WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		if err := st.Send(&testingv1.WatchResponse{}); err != nil {
			return err
		}
		if r.GetKey() == "hang" {
			<-st.Context().Done()
			return st.Context().Err()
		}
		return nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	conn := end.DialT(t, interceptor.DialOptions(interceptor.WithClientTracerProvider(ec))...)
	client := testingv1.NewTestServiceClient(conn)

	// Read to the end.
	st, err := client.Watch(t.Context(), &testingv1.WatchRequest{Key: "k"})
	require.NoError(t, err)
	for {
		if _, err := st.Recv(); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
	}
	// Refused before its first try.
	short, cancel := context.WithTimeout(t.Context(), time.Microsecond)
	time.Sleep(time.Millisecond)
	_, err = client.Watch(short, &testingv1.WatchRequest{Key: "k"})
	cancel()
	require.Error(t, err)
	// Abandoned after its status arrived, unread.
	actx, acancel := context.WithCancel(t.Context())
	_, err = client.Watch(actx, &testingv1.WatchRequest{Key: "k"})
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	acancel()
	// Abandoned while running.
	hctx, hcancel := context.WithCancel(t.Context())
	hs, err := client.Watch(hctx, &testingv1.WatchRequest{Key: "hang"})
	require.NoError(t, err)
	_, err = hs.Recv()
	require.NoError(t, err)
	hcancel()
	_, _ = hs.Recv()
	// Cut by the ClientConn's close, then read.
	conn2 := end.DialT(t, interceptor.DialOptions(interceptor.WithClientTracerProvider(ec))...)
	cs, err := testingv1.NewTestServiceClient(conn2).Watch(t.Context(), &testingv1.WatchRequest{Key: "hang"})
	require.NoError(t, err)
	_, err = cs.Recv()
	require.NoError(t, err)
	require.NoError(t, conn2.Close())
	time.Sleep(50 * time.Millisecond)
	_, _ = cs.Recv()
	_, _ = cs.Recv()
	require.Eventually(t, func() bool { // every way a stream ends has ended its span
		ec.mu.Lock()
		defer ec.mu.Unlock()
		return len(ec.ends) == 5
	}, 2*time.Second, 10*time.Millisecond)
	ec.check(t)
	ec.mu.Lock()
	require.Len(t, ec.ends, 5)
	ec.mu.Unlock()
}

// A three-hop call whose middle handler fans out with budget.Split to two
// dependency calls, with repeats at the origin and in the middle: every
// tollgate.call span carries the one attempt ID, the spend events' units add
// up to the calls the dependency received, and the origin span's
// tollgate.allowance.spent says the same.
func TestSpendAddsUpWithSplitFanOutAndRepeats(t *testing.T) {
	tp, spans := testTracer(t)
	mp, reader := testMeter(t)

	fast := interceptor.RetryPolicy{InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	origin, mid := fast, fast
	origin.MaxTries, mid.MaxTries = 2, 2
	dep := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull)
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions(interceptor.WithRetry(mid),
		interceptor.WithClientTracerProvider(tp), interceptor.WithClientMeterProvider(mp))...))
	midSvc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		parts := budget.Split(ctx, 2)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, p := range parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = depClient.Get(p, r)
			}()
		}
		wg.Wait()
		for _, e := range errs {
			if e != nil {
				return nil, e
			}
		}
		return &testingv1.GetResponse{}, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, midSvc.Register, serverOpts()...)
	originClient := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(interceptor.WithAllowance(9),
		interceptor.WithRetry(origin), interceptor.WithClientTracerProvider(tp), interceptor.WithClientMeterProvider(mp))...))
	_, err := originClient.Get(t.Context(), &testingv1.GetRequest{})
	require.Error(t, err)

	ids := map[string]bool{}
	var spent, originSpent int64
	for _, s := range spans.GetSpans() {
		if s.Name != "tollgate.call" {
			continue
		}
		id, ok := attr(s.Attributes, "tollgate.attempt.id")
		require.True(t, ok)
		ids[id.AsString()] = true
		if !s.Parent.IsValid() {
			v, _ := attr(s.Attributes, "tollgate.allowance.spent")
			originSpent = v.AsInt64()
		}
		for _, e := range s.Events {
			if e.Name == "tollgate.allowance.spend" {
				u, _ := attr(e.Attributes, "units")
				spent += u.AsInt64()
			}
		}
	}
	require.Len(t, ids, 1)
	t.Logf("dep calls %d, spend units %d, origin spent %d", dep.Calls("Get"), spent, originSpent)
	require.Equal(t, dep.Calls("Get"), spent)
	require.Equal(t, spent, originSpent)
	require.LessOrEqual(t, spent, int64(9))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, spent, counter(rm, "tollgate.allowance.spent"), "the metric counts what the events count")
}

// tollgate.client.tries counts tries that may have been sent, and
// tollgate.allowance.exhausted each local refusal once.
func TestExhaustedCountedOncePerLocalRefusal(t *testing.T) {
	mp, reader := testMeter(t)
	fast := interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	tr := newTiers(t,
		[]interceptor.ClientOption{interceptor.WithAllowance(1), interceptor.WithRetry(fast)},
		[]interceptor.ClientOption{interceptor.WithRetry(fast), interceptor.WithClientMeterProvider(mp)},
		func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return nil, status.NotAdmitted(status.ReasonQueueFull)
		})
	_, err := tr.origin.Get(t.Context(), &testingv1.GetRequest{})
	require.Error(t, err)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	t.Logf("dep calls %d, exhausted %d, tries %d", tr.dep.Calls("Get"), counter(rm, "tollgate.allowance.exhausted"), counter(rm, "tollgate.client.tries"))
	require.Equal(t, tr.dep.Calls("Get"), counter(rm, "tollgate.client.tries"))
}

// A unary try whose invoker panicked is settled (its grant held, its unit
// kept); the review found that it recorded no tollgate.allowance.spend
// event, which the README promises "one per try once it ended" (the stream
// owner's panic path records it), so below the origin its unit was missing
// from the trace's sum; nor did the span get its end attributes.
func TestUnaryPanicStillRecordsTheSpendEvent(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	unary, _, err := interceptor.NewClientInterceptors(interceptor.WithClientTracerProvider(tp))
	require.NoError(t, err)
	panicking := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		_ = invoker(ctx, method, req, reply, cc, opts...) // the try was sent
		panic("an inner interceptor panics after the try")
	}
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{GetFunc: okGet}).Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainUnaryInterceptor(unary, panicking),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = client.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	}()
	require.Len(t, spans.Ended(), 1)
	var events int
	for _, e := range spans.Ended()[0].Events() {
		if e.Name == "tollgate.allowance.spend" {
			events++
		}
	}
	require.Equal(t, 1, events, "one spend event per try once it ended")
	var outcome, try string
	for _, a := range spans.Ended()[0].Attributes() {
		switch a.Key {
		case "tollgate.outcome":
			outcome = a.Value.String()
		case "tollgate.try":
			try = a.Value.String()
		}
	}
	require.Equal(t, "UNKNOWN", outcome, "the span says how the call ended")
	require.Equal(t, "1", try, "and the last try sent")
}

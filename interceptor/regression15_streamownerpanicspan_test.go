package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
)

type endCountingSpan struct {
	trace.Span
	ends *atomic.Int64
}

func (s endCountingSpan) End(...trace.SpanEndOption) { s.ends.Add(1) }

type endCountingTracer struct {
	embedded.Tracer
	ends *atomic.Int64
}

func (t endCountingTracer) Start(ctx context.Context, _ string, _ ...trace.SpanStartOption) (context.Context, trace.Span) {
	s := endCountingSpan{Span: noop.Span{}, ends: t.ends}
	return trace.ContextWithSpan(ctx, s), s
}

type endCountingProvider struct {
	embedded.TracerProvider
	ends *atomic.Int64
}

func (p endCountingProvider) Tracer(string, ...trace.TracerOption) trace.Tracer {
	return endCountingTracer{ends: p.ends}
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// When what lies below the stream interceptor panics while the first try's
// stream is opened, newTryStreamLocked's deferred panickedLocked ends the
// stream (endLocked → endSpan → span.End), and then client.stream's own
// deferred "a panic below the interceptor goes on; the span ends"
// (client.go: `if !returned { cs.span.End() }`) ends it a second time.
// trace.Span.End is documented to be called once; the SDK ignores a second
// End, but any other TracerProvider (a vendor's, a bridge) sees the call's
// span end twice.
func TestRegression15StreamOwnerPanicSpanEndsOnce(t *testing.T) {
	var ends atomic.Int64
	panicking := grpc.WithChainStreamInterceptor(func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, grpc.Streamer, ...grpc.CallOption) (grpc.ClientStream, error) {
		panic("an inner interceptor panics")
	})
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{}).Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3),
		interceptor.WithClientTracerProvider(endCountingProvider{ends: &ends})), panicking)...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	func() {
		defer func() { require.NotNil(t, recover(), "the panic goes on up") }()
		_, _ = client.Chat(ctx)
	}()
	require.Equal(t, int64(1), ends.Load(), "the tollgate.call span is ended once")
}

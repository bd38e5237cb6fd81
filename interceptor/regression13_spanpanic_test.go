package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
)

// The unary client interceptor started the tollgate.call span and ended it
// only after its owner returned: when what lies below it panics (an inner
// interceptor, a codec) and the application recovers above, the span was
// never ended, never exported, and a processor tracking open spans kept it
// for ever. It is now ended on the way out of the panic.
func TestRegression13CallSpanEndsWhenTheInvokerPanics(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	unary, _, err := interceptor.NewClientInterceptors(interceptor.WithClientTracerProvider(tp))
	require.NoError(t, err)
	panicking := func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
		panic("an inner interceptor panics")
	}
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{}).Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainUnaryInterceptor(unary, panicking),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = client.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	}()
	require.Len(t, spans.Started(), 1, "precondition: the tollgate.call span was started")
	require.Len(t, spans.Ended(), 1, "the tollgate.call span ends after a panic below the interceptor")
}

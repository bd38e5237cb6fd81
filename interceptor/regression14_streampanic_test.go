package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
)

// A panic below the stream interceptor while it opened a repeat (an inner
// interceptor, a codec; here inside the caller's RecvMsg) went up to the
// caller with the stream still open: its tollgate.call span stayed open
// until the caller's context ended, and the caller's next RecvMsg sent yet
// another try. The stream now ends where the panic passes: the span ends,
// and every later method returns the stream's typed result — here
// NOT_ADMITTED, since the first try was refused and the repeat never left.
func TestRegression14StreamPanicOnARepeatEndsTheStream(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, stream, err := interceptor.NewClientInterceptors(interceptor.WithClientTracerProvider(tp))
	require.NoError(t, err)
	var opened atomic.Int32
	panicking := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if opened.Add(1) > 1 {
			panic("an inner interceptor panics on the repeat")
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	svc := &testsvc.Service{WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		return status.NotAdmitted(status.ReasonQueueFull)
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainStreamInterceptor(stream, panicking),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel() // the context outlives the checks below: only the panic may end the span
	st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "k"})
	require.NoError(t, err)
	func() {
		defer func() { require.NotNil(t, recover(), "precondition: the repeat panics") }()
		_, _ = st.Recv()
	}()
	require.Len(t, spans.Started(), 1, "precondition: the tollgate.call span was started")
	require.Len(t, spans.Ended(), 1, "the tollgate.call span ends where the panic passes")

	_, err = st.Recv()
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "nothing was admitted: %v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "the result names the attempt")
	require.EqualValues(t, 2, opened.Load(), "no try is sent after the panic")
}

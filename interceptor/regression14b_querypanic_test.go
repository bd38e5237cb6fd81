package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// 61b42de ends the stream (and its span) when a panic below the interceptor
// passes while a repeat opens, so that the caller's next RecvMsg does not go
// on with a half-settled stream. The resolution query goes through the same
// streamer (streamInvoker), after afterTryLocked settled the try
// (finishLocked): a panic there leaves the stream open, its span open, and
// the caller's next RecvMsg reads the old try's error again and settles the
// same try a second time (tollgate.client.tries counts it twice, its loan is
// listed twice in owner.loans — ReconcileCall then subtracts its counted
// units twice — and another query is sent).
func TestRegression14bClientStreamPanicInResolutionEndsTheStream(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	_, stream, err := interceptor.NewClientInterceptors(interceptor.WithClientTracerProvider(tp),
		interceptor.WithClientMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	require.NoError(t, err)
	var queries atomic.Int32
	panicking := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if method == "/tollgate.v1.AttemptService/FenceAttempt" {
			queries.Add(1)
			panic("an inner interceptor panics on the query")
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	svc := &testsvc.Service{}
	// A proxy in front of tollgate's server answers without tollgate's
	// detail: the try is UNKNOWN, resolved with the query.
	var sent atomic.Int32
	lose := grpc.ChainStreamInterceptor(func(any, grpc.ServerStream, *grpc.StreamServerInfo, grpc.StreamHandler) error {
		sent.Add(1)
		return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
	})
	end := recordedServer(t, svc, memoryStore(t), lose)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainStreamInterceptor(stream, panicking),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	recovering := func(f func() error) (p any, err error) {
		defer func() { p = recover() }()
		return nil, f()
	}
	recv := func() (any, error) {
		return recovering(func() error { _, err := st.Recv(); return err })
	}
	// The query runs in Send when the try has already ended by then (the
	// proxy answers at once), else in Recv.
	p, err := recovering(func() error { return st.Send(&testingv1.ChatRequest{Value: "a"}) })
	if p == nil {
		require.NoError(t, err)
		p, err = recv()
	}
	require.NotNil(t, p, "precondition: the query panics; got %v", err)
	require.EqualValues(t, 1, queries.Load())

	p, _ = recv() // the caller goes on with the stream
	require.EqualValues(t, 1, sent.Load(), "one try reached the server")
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, int64(1), counter(rm, "tollgate.client.tries"), "one try was sent; it is settled and counted once")
	require.Nil(t, p, "the stream ended where the first panic passed: no second query (queries: %d)", queries.Load())
	require.Len(t, spans.Ended(), 1, "the tollgate.call span ends where the panic passes")
}

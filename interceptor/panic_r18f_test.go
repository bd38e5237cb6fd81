package interceptor_test

import (
	"context"
	"io"
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

// The flake of TestPanicInCloseSendAfterReplayEndsTheStream: when the
// first try's refusal arrives before the caller's Send, SendMsg repeats the
// stream and its replay hands the repeat to CloseSend before the caller
// closes its side. The caller's CloseSend then runs the repeat's
// (panicking) CloseSend itself, on the caller's goroutine: the panic went on
// up to the caller, as it should, but left the stream open, unlike a panic
// passing through RecvMsg, Header, or the same CloseSend on the replay's
// goroutine (panickedLocked: "ends the stream when a panic below the
// interceptor passes through one of its methods"): its span stayed open and
// the stream went on, its result depending on which goroutine happened to
// close the repeat.
func TestCallerCloseSendPanicOnARepeatEndsTheStream(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{LookupFunc: func(ss grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error {
		if runs.Add(1) == 1 {
			return status.NotAdmitted(status.ReasonQueueFull) // before any request: repeated
		}
		readToEnd(ss) // ends when the stream is cancelled: its half-close never comes
		return nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	var opened atomic.Int32
	inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		st, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || opened.Add(1) == 1 {
			return st, err
		}
		return panicOnCloseSend{st}, nil
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, stream, err := interceptor.NewClientInterceptors(fastRetry(3), interceptor.WithClientTracerProvider(tp))
	require.NoError(t, err)
	seen := newTrailerSeen()
	conn := end.DialT(t, grpc.WithChainStreamInterceptor(stream, inner),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithStatsHandler(seen), grpc.WithDisableRetry())
	client := testingv1.NewTestServiceClient(conn)
	st, err := client.Lookup(t.Context())
	require.NoError(t, err)
	seen.arrived(t)            // the first try's refusal arrived
	transportCaughtUp(t, conn) // and grpc-go closed its stream: SendMsg sees io.EOF and repeats
	require.NoError(t, st.Send(&testingv1.LookupRequest{Key: "a"}))
	// The second send waits for the replay of the first, which handed the
	// repeat to CloseSend (the caller had not closed its side).
	require.NoError(t, st.Send(&testingv1.LookupRequest{Key: "b"}))
	require.EqualValues(t, 2, opened.Load(), "precondition: the repeat was opened")
	func() {
		defer func() { require.NotNil(t, recover(), "precondition: the repeat's CloseSend panics in the caller's") }()
		_ = st.CloseSend()
	}()
	require.Len(t, spans.Ended(), 1, "the tollgate.call span ends where the panic passes")
	_, err = st.Recv()
	require.Error(t, err)
	require.NotEqual(t, status.KindOK, status.OutcomeOf(err).Kind)
	require.NotEmpty(t, status.OutcomeOf(err).Detail.GetAttemptId(), "a typed result naming the attempt: %v", err)
	require.EqualValues(t, 2, opened.Load(), "no try is sent after the panic")
}

// The caller's SendMsg ran the current try's SendMsg without a guard: a
// panic below the interceptor there (an inner interceptor, a codec's
// Marshal) went on up to the caller with the stream open, its span open and
// its try unsettled, where the same panic in RecvMsg ends the stream.
func TestCallerSendPanicEndsTheStream(t *testing.T) {
	svc := &testsvc.Service{LookupFunc: func(ss grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error {
		readToEnd(ss) // ends when the stream is cancelled
		return nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	var opened atomic.Int32
	inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		st, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		opened.Add(1)
		return panicOnSend{st}, nil
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	_, stream, err := interceptor.NewClientInterceptors(fastRetry(3), interceptor.WithClientTracerProvider(tp))
	require.NoError(t, err)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainStreamInterceptor(stream, inner),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))
	st, err := client.Lookup(t.Context())
	require.NoError(t, err)
	func() {
		defer func() { require.NotNil(t, recover(), "precondition: the try's SendMsg panics in the caller's") }()
		_ = st.Send(&testingv1.LookupRequest{Key: "a"})
	}()
	require.Len(t, spans.Ended(), 1, "the tollgate.call span ends where the panic passes")
	_, err = st.Recv()
	require.Error(t, err)
	require.NotEqual(t, status.KindOK, status.OutcomeOf(err).Kind)
	require.NotEmpty(t, status.OutcomeOf(err).Detail.GetAttemptId(), "a typed result naming the attempt: %v", err)
	require.ErrorIs(t, st.Send(&testingv1.LookupRequest{Key: "b"}), io.EOF, "the stream ended: SendMsg sends nothing more")
	require.EqualValues(t, 1, opened.Load(), "no try is sent after the panic")
}

package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
)

// A stream whose caller cancels while no RecvMsg is under way is ended by
// clientStream.abandon with the bare context status (stream_owner.go:264),
// never typed: the caller's next Recv gets a CANCELLED with no tollgate
// detail and no attempt ID, where a unary call cancelled mid-try, or a
// stream cancelled during Recv, ends UNKNOWN naming its attempt (DESIGN.md
// §3.5, §3.6: the client returns typed outcomes; an unresolved try is
// UNKNOWN "with the attempt ID").
func TestRegression13AbandonedStreamEndsTyped(t *testing.T) {
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		<-st.Context().Done()
		return st.Context().Err()
	}}
	end := recordedServer(t, svc, memoryStore(t))
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(30*time.Second), interceptor.WithClientTracerProvider(tp))...))
	ctx, cancel := context.WithCancel(t.Context())
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{}))
	cancel() // no Recv under way: abandon ends the stream
	require.Eventually(t, func() bool { return len(spans.GetSpans()) == 1 }, 10*time.Second, time.Millisecond,
		"the stream's tollgate.call span ended")
	_, err = st.Recv()
	require.Error(t, err)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotNil(t, o.Detail, "the outcome is typed: %v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "the outcome names its attempt: %v", err)
}

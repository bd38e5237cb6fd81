package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// recvGateCodec is the proto codec, except that the first unmarshalling of
// a ChatResponse waits until release is closed (a slow decode of a large
// message); reached is closed when it starts.
type recvGateCodec struct {
	once             sync.Once
	reached, release chan struct{}
}

func (c *recvGateCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (c *recvGateCodec) Unmarshal(data []byte, v any) error {
	if _, ok := v.(*testingv1.ChatResponse); ok {
		c.once.Do(func() {
			close(c.reached)
			<-c.release
		})
	}
	return proto.Unmarshal(data, v.(proto.Message))
}
func (*recvGateCodec) Name() string { return "proto" }

// A review found that a caller releases a stream by cancelling its context
// (grpc-go's documented way). clientStream.abandon (stream_owner.go:297)
// leaves the stream to RecvMsg when one is under way ("RecvMsg will see the
// context's end"), but a RecvMsg already decoding a message returns that
// message, not the context's end: nobody then settles the try. Its grant
// stays reserved in the attempt's ledger for good and the tollgate.call
// span never ends, though the caller did what grpc-go asks to release the
// stream (TestStreamAbandonedByCancelSettlesItsTry: "the abandoned try was
// settled").
func TestRegression14ClientCancelDuringRecvSettlesTheTry(t *testing.T) {
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		if err := st.Send(&testingv1.ChatResponse{}); err != nil {
			return err
		}
		<-st.Context().Done()
		return st.Context().Err()
	}}
	codec := &recvGateCodec{reached: make(chan struct{}), release: make(chan struct{})}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(
		fastRetry(3), interceptor.WithClientTracerProvider(tp)),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(codec)))...))
	actx, err := interceptor.StartAttempt(t.Context(), 4, 30*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(actx)
	defer cancel()

	st, err := client.Chat(ctx)
	require.NoError(t, err)
	recvd := make(chan error, 1)
	go func() { _, err := st.Recv(); recvd <- err }()
	<-codec.reached // Recv is decoding the first message
	cancel()        // the caller releases the stream
	// abandon runs on a goroutine of its own (context.AfterFunc) and finds
	// Recv under way; give it the time to do so. (Should it run later, it
	// settles the try and the test passes: this wait cannot fail the test.)
	time.Sleep(200 * time.Millisecond)
	close(codec.release)
	require.NoError(t, <-recvd, "the message being decoded is returned")

	ledger, _ := budget.FromContext(actx)
	require.Eventually(t, func() bool { return ledger.Snapshot().Reserved == 0 }, 3*time.Second, 10*time.Millisecond,
		"the released stream's try is settled: %+v", ledger.Snapshot())
	require.Eventually(t, func() bool { return len(spans.GetSpans()) == 1 }, 3*time.Second, 10*time.Millisecond,
		"the stream's tollgate.call span ended")
}

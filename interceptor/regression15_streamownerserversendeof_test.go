package interceptor_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// grpc.ClientStream.SendMsg (grpc-go 1.85, stream.go:117-122): "For unary or
// server-streaming RPCs (StreamDesc.ClientStreams is false), a nil error is
// returned unconditionally" (on a stream that ended, grpc-go's SendMsg
// turns io.EOF into nil: the status is RecvMsg's). The generated stub of a
// server-streaming method returns SendMsg's error as the call's error.
// tollgate's clientStream.SendMsg returns io.EOF whenever its stream is
// done, whatever the kind: a caller whose context is cancelled (or whose
// ClientConn closes) just after the stream opened gets (nil, io.EOF) from
// client.Watch — a bare io.EOF, not a status, and not the typed result the
// stream ended with — where grpc-go returns the stream and Recv returns
// the status.
func TestRegression15StreamOwnerServerStreamSendEOF(t *testing.T) {
	t.Run("grpc-go", func(t *testing.T) { reviewServerStreamSendEOF(t, false) })
	t.Run("tollgate", func(t *testing.T) { reviewServerStreamSendEOF(t, true) })
}

func reviewServerStreamSendEOF(t *testing.T, tollgate bool) {
	svc := &testsvc.Service{WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		<-st.Context().Done()
		return st.Context().Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	var cancel context.CancelFunc
	finished := make(chan struct{})
	// Outside tollgate: the stream opens, then the caller's context is
	// cancelled before the stub's SendMsg runs (a scheduling delay).
	outer := grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		st, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		cancel()
		select {
		case <-finished: // the stream ended (its OnFinish ran)
		case <-time.After(5 * time.Second):
		}
		return st, nil
	})
	dopts := []grpc.DialOption{outer}
	if tollgate {
		dopts = append(dopts, interceptor.DialOptions(fastRetry(3))...)
	}
	client := testingv1.NewTestServiceClient(end.DialT(t, dopts...))
	actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	ctx, c := context.WithCancel(actx)
	cancel = c
	defer cancel()

	st, err := client.Watch(ctx, &testingv1.WatchRequest{Count: 1}, grpc.OnFinish(func(error) { close(finished) }))
	require.NotErrorIs(t, err, io.EOF, "SendMsg of a server-streaming call never returns io.EOF")
	require.NoError(t, err, "as grpc-go's, the stream is returned; its status is Recv's")
	_, err = st.Recv()
	require.Error(t, err)
}

package interceptor_test

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// A review found that a stream's Context was cancelled by a repeat while the
// stream went on delivering messages. grpc.ClientStream.Context is
// documented "It should not be called until after Header or RecvMsg has
// returned. Once called, subsequent client-side retries are disabled", and
// grpc-go commits the stream there, so the context it hands out lives as
// long as the stream; tollgate's returned the current try's context and
// repeated the stream anyway, so a caller (or an outer interceptor waiting
// on <-Context().Done() for the stream's end) saw it end early. Context now
// hands out a context of the stream's own, which ends with the stream.
func TestRegression15ClientContextAfterRepeat(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		if runs.Add(1) == 1 {
			if err := ss.SendHeader(nil); err != nil { // a header: Header returns
				return err
			}
			time.Sleep(20 * time.Millisecond)
			return shed() // no message yet: tollgate repeats the stream
		}
		for range 2 {
			if err := ss.Send(&testingv1.WatchResponse{Value: "v"}); err != nil {
				return err
			}
		}
		return nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	st, err := client.Watch(t.Context(), &testingv1.WatchRequest{Key: "k"})
	require.NoError(t, err)
	_, err = st.Header() // Header has returned: Context may now be called
	require.NoError(t, err)
	sctx := st.Context()
	got := 0
	for {
		_, err := st.Recv()
		if err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
		got++
		require.NoError(t, sctx.Err(),
			"the stream's Context() was cancelled while the stream still delivers messages (runs=%d)", runs.Load())
	}
	require.Equal(t, 2, got, "the stream was repeated and delivered the second run's messages")
	require.Equal(t, int64(2), runs.Load())
	select {
	case <-sctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the stream's context did not end with the stream")
	}
}

package interceptor_test

import (
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
// A bidi stream with response messages waiting unread when its ClientConn
// closes. grpc-go ends the stream with "the client connection is closing",
// queued behind what the transport had buffered: RecvMsg returns those
// messages, then the error. tollgate's tryFinished (stream_owner.go,
// endUnreadLocked's default case) ends the stream outright when its status
// had not arrived, and RecvMsg returns cs.final without reading cur: the
// messages are dropped (the deadline case releases the stream instead, so
// that they are read). The README promises they are read: "a stream ends
// when its context does, when its ClientConn closes, or at its deadline
// ... the caller's later reads still get the messages and the status that
// had arrived".
func TestRegression15StreamOwnerConnCloseDropsBuffered(t *testing.T) {
	t.Run("grpc-go", func(t *testing.T) { reviewConnCloseDrops(t, false) })
	t.Run("tollgate", func(t *testing.T) { reviewConnCloseDrops(t, true) })
}

func reviewConnCloseDrops(t *testing.T, tollgate bool) {
	sent := make(chan struct{})
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		for _, v := range []string{"a", "b", "c"} {
			if err := st.Send(&testingv1.ChatResponse{Value: v}); err != nil {
				return err
			}
		}
		close(sent)
		<-st.Context().Done()
		return st.Context().Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	var dopts []grpc.DialOption
	if tollgate {
		dopts = interceptor.DialOptions(fastRetry(3))
	}
	conn := end.DialT(t, dopts...)
	client := testingv1.NewTestServiceClient(conn)
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	<-sent
	time.Sleep(100 * time.Millisecond) // the three responses reach the client's buffer
	require.NoError(t, conn.Close())
	time.Sleep(100 * time.Millisecond) // the stream's end is seen
	var got []string
	for {
		m, err := st.Recv()
		if err != nil {
			break
		}
		got = append(got, m.GetValue())
	}
	require.Equal(t, []string{"a", "b", "c"}, got, "the messages that arrived before the close are the caller's")
}

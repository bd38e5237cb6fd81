package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
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
	bufferedChat(t, tollgate, nil, func(conn *grpc.ClientConn, _ grpc.BidiStreamingClient[testingv1.ChatRequest, testingv1.ChatResponse], _ context.CancelFunc) {
		require.NoError(t, conn.Close())
		time.Sleep(100 * time.Millisecond) // the stream's end is seen
	})
}

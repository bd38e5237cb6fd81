package interceptor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"google.golang.org/grpc"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A bidi stream whose SendMsg fails locally (a message over the caller's
// MaxCallSendMsgSize) while response messages that arrived before it wait
// unread. grpc-go's SendMsg ends the stream with the local error
// (cs.finish), which the transport queues behind what it had buffered: the
// caller's RecvMsg still returns those messages, then the error.
// tollgate's SendMsg local-error path (stream_owner.go, SendMsg: "if
// !cs.done { ... cs.endLocked(...) }") marks the stream done at once, and
// RecvMsg returns cs.final before reading cur: the messages the callee sent
// (and whose effects happened) are dropped.
func TestRegression15StreamOwnerLocalSendDropsBuffered(t *testing.T) {
	t.Run("grpc-go", func(t *testing.T) { reviewLocalSendDrops(t, false) })
	t.Run("tollgate", func(t *testing.T) { reviewLocalSendDrops(t, true) })
}

func reviewLocalSendDrops(t *testing.T, tollgate bool) {
	dopts := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1024))}
	bufferedChat(t, tollgate, dopts, func(_ *grpc.ClientConn, st grpc.BidiStreamingClient[testingv1.ChatRequest, testingv1.ChatResponse], _ context.CancelFunc) {
		require.Error(t, st.Send(&testingv1.ChatRequest{Value: strings.Repeat("x", 4096)}), "a local error")
	})
}

package interceptor_test

import (
	"strings"
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
	dopts := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1024))}
	if tollgate {
		dopts = append(dopts, interceptor.DialOptions(fastRetry(3))...)
	}
	client := testingv1.NewTestServiceClient(end.DialT(t, dopts...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	<-sent
	time.Sleep(100 * time.Millisecond) // the three responses reach the client's buffer
	require.Error(t, st.Send(&testingv1.ChatRequest{Value: strings.Repeat("x", 4096)}), "a local error")
	var got []string
	for {
		m, err := st.Recv()
		if err != nil {
			break
		}
		got = append(got, m.GetValue())
	}
	require.Equal(t, []string{"a", "b", "c"}, got, "the messages that arrived before the local error are the caller's")
}

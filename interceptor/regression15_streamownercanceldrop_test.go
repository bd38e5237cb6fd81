package interceptor_test

import (
	"context"
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
// A bidi stream with response messages waiting unread when the caller
// cancels its context (grpc-go's documented way to end a stream). grpc-go
// queues the cancellation behind what the transport had buffered
// (recvBufferReader.readClient closes the stream, then reads the buffer in
// order): RecvMsg returns those messages, then CANCELLED. The README says
// the same of tollgate ("a stream ends when its context does ... the
// caller's later reads still get the messages and the status that had
// arrived"). abandonLocked releases the stream (reads drain it) only when
// the try's status had arrived; otherwise it ends it (endLocked) and
// RecvMsg returns cs.final without reading cur: the messages are dropped.
func TestRegression15StreamOwnerCancelDropsBuffered(t *testing.T) {
	t.Run("grpc-go", func(t *testing.T) { reviewCancelDrops(t, false) })
	t.Run("tollgate", func(t *testing.T) { reviewCancelDrops(t, true) })
}

func reviewCancelDrops(t *testing.T, tollgate bool) {
	bufferedChat(t, tollgate, nil, func(_ *grpc.ClientConn, _ grpc.BidiStreamingClient[testingv1.ChatRequest, testingv1.ChatResponse], cancel context.CancelFunc) {
		cancel()
		time.Sleep(100 * time.Millisecond) // the stream's end is seen
	})
}

// bufferedChat opens a Chat, through tollgate when tollgate is set (with
// dopts), whose handler sends "a", "b" and "c" and waits; once they reached
// the client unread, end ends the stream (it is given the conn, the stream
// and the cancel of the stream's context), and the test requires that the
// caller's reads still get the three messages, as grpc-go delivers them.
func bufferedChat(t *testing.T, tollgate bool, dopts []grpc.DialOption,
	end func(*grpc.ClientConn, grpc.BidiStreamingClient[testingv1.ChatRequest, testingv1.ChatResponse], context.CancelFunc)) {
	t.Helper()
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
	srv := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	if tollgate {
		dopts = append(dopts, interceptor.DialOptions(fastRetry(3))...)
	}
	conn := srv.DialT(t, dopts...)
	actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(actx)
	defer cancel()
	st, err := testingv1.NewTestServiceClient(conn).Chat(ctx)
	require.NoError(t, err)
	<-sent
	time.Sleep(100 * time.Millisecond) // the three responses reach the client's buffer
	end(conn, st, cancel)
	var got []string
	for {
		m, err := st.Recv()
		if err != nil {
			break
		}
		got = append(got, m.GetValue())
	}
	require.Equal(t, []string{"a", "b", "c"}, got, "the messages that arrived before the stream's end are the caller's")
}

// The same at the caller's own deadline, reached while nothing read the
// stream and before the try's status arrived: the try is decided and
// resolved as a read would, and the caller's reads still get the messages
// that arrived before the deadline, then that result. Before, abandon
// settled and ended the stream, and the messages were dropped.
func TestRegression15StreamOwnerCallerDeadlineKeepsBuffered(t *testing.T) {
	for _, tollgate := range []bool{false, true} {
		t.Run(map[bool]string{false: "grpc-go", true: "tollgate"}[tollgate], func(t *testing.T) {
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
			srv := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			var dopts []grpc.DialOption
			if tollgate {
				dopts = interceptor.DialOptions(fastRetry(3), interceptor.WithAttemptTimeout(time.Minute),
					interceptor.WithHopMargin(0)) // the caller's deadline and the try's are one: abandon may see it first
			}
			conn := srv.DialT(t, dopts...)
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancel()
			st, err := testingv1.NewTestServiceClient(conn).Chat(ctx)
			require.NoError(t, err)
			<-sent
			<-ctx.Done()
			time.Sleep(100 * time.Millisecond) // the stream's end is seen
			var got []string
			for {
				m, err := st.Recv()
				if err != nil {
					require.Error(t, err)
					break
				}
				got = append(got, m.GetValue())
			}
			require.Equal(t, []string{"a", "b", "c"}, got, "the messages that arrived before the caller's deadline are the caller's")
		})
	}
}

package interceptor_test

import (
	"context"
	"io"
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
// a5d7958: a stream's SendMsg that fails locally after the try's status
// arrived unread now reads that status (readStatusLocked), dropping every
// message that came before it, ends the stream with it and returns its end.
// When the status is OK, SendMsg returns io.EOF, which by grpc-go's contract
// says "the stream ended; RecvMsg returns its messages and status": the
// caller's RecvMsg returns io.EOF at once. The server's messages are lost and
// the stream reads as a clean, complete success. Before a5d7958 the send
// returned an error, so the caller knew the stream failed; plain grpc-go
// hands the caller every message and then io.EOF.
func TestRegression15StreamLocalDrop(t *testing.T) {
	cases := map[string]struct {
		bad  *testingv1.ChatRequest
		opts []grpc.DialOption
	}{
		"inner interceptor refuses": {bad: &testingv1.ChatRequest{Value: "bad"}},
		"grpc-go max send size": {bad: &testingv1.ChatRequest{Value: strings.Repeat("x", 4096)},
			opts: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1024))}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
				for _, v := range []string{"a", "b", "c"} {
					if err := st.Send(&testingv1.ChatResponse{Value: v}); err != nil {
						return err
					}
				}
				return nil
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				st, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil {
					return nil, err
				}
				return r8Validating{st}, nil
			}
			seen := trailerSeen{ch: make(chan struct{}, 1)}
			opts := append(interceptor.DialOptions(fastRetry(1)), grpc.WithChainStreamInterceptor(inner), grpc.WithStatsHandler(seen))
			conn := end.DialT(t, append(opts, tc.opts...)...)
			actx, err := interceptor.StartAttempt(t.Context(), 4, time.Minute)
			require.NoError(t, err)
			st, err := testingv1.NewTestServiceClient(conn).Chat(actx)
			require.NoError(t, err)
			select {
			case <-seen.ch:
			case <-time.After(10 * time.Second):
				t.Fatal("precondition: the server's status never arrived")
			}
			serr := st.Send(tc.bad)
			require.Error(t, serr)
			if serr != io.EOF {
				return // the caller is told the stream failed: nothing lost silently
			}
			var got []string
			var rerr error
			for {
				m, err := st.Recv()
				if err != nil {
					rerr = err
					break
				}
				got = append(got, m.GetValue())
			}
			t.Logf("Send: %v; Recv: %v, then %v", serr, got, rerr)
			if rerr == io.EOF {
				require.Equal(t, []string{"a", "b", "c"}, got,
					"Send returned io.EOF and the stream ended OK, yet the server's messages were dropped")
			}
		})
	}
}

// The same on a client-streaming call whose server answered early
// (SendAndClose, then OK) and whose caller's next Send is too large for
// grpc-go: Send returns io.EOF and CloseAndRecv then returns (nil, io.EOF):
// the server's response is gone. Plain grpc-go returns the local
// RESOURCE_EXHAUSTED from Send and the response from CloseAndRecv.
func TestRegression15StreamLocalDropUpload(t *testing.T) {
	svc := &testsvc.Service{UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		return st.SendAndClose(&testingv1.UploadResponse{Count: 7})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	seen := trailerSeen{ch: make(chan struct{}, 1)}
	opts := append(interceptor.DialOptions(fastRetry(1)), grpc.WithStatsHandler(seen),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1024)))
	conn := end.DialT(t, opts...)
	actx, err := interceptor.StartAttempt(t.Context(), 4, time.Minute)
	require.NoError(t, err)
	st, err := testingv1.NewTestServiceClient(conn).Upload(actx)
	require.NoError(t, err)
	select {
	case <-seen.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("precondition: the server's status never arrived")
	}
	serr := st.Send(&testingv1.UploadRequest{Value: strings.Repeat("x", 4096)})
	require.Error(t, serr)
	if serr != io.EOF {
		return
	}
	resp, rerr := st.CloseAndRecv()
	t.Logf("Send: %v; CloseAndRecv: %v, %v", serr, resp, rerr)
	require.NotEqual(t, io.EOF, rerr, "Send returned io.EOF, yet CloseAndRecv returns no response and io.EOF: the server's response was dropped")
}

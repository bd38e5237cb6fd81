package interceptor_test

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// panicRecvStream is a stream whose RecvMsg panics, as a codec or an inner
// interceptor below tollgate's may.
type panicRecvStream struct{ grpc.ClientStream }

func (panicRecvStream) RecvMsg(any) error { panic("an inner interceptor panics in RecvMsg") }

// A panic below the stream interceptor inside the caller's RecvMsg (an inner
// interceptor, a codec: what 61b42de handles when it happens while a repeat
// opens) reaches clientStream.RecvMsg while it runs cur.RecvMsg without its
// lock; the deferred cs.mu.Unlock (stream_owner.go:547) then unlocks an
// unlocked mutex: "fatal error: sync: unlock of unlocked mutex", which no
// recover can catch. grpc-go alone lets the panic reach the caller, who may
// recover it. The scenario runs in a child process, since it kills the
// process.
func TestRegression14bClientStreamPanicInRecvIsRecoverable(t *testing.T) {
	if os.Getenv("TOLLGATE_REVIEW_RECVPANIC_CHILD") == "1" {
		reviewRecvPanicChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRegression14bClientStreamPanicInRecvIsRecoverable$", "-test.v")
	cmd.Env = append(os.Environ(), "TOLLGATE_REVIEW_RECVPANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child process died:\n%s", out)
	require.Contains(t, string(out), "recovered: an inner interceptor panics in RecvMsg")
}

func reviewRecvPanicChild(t *testing.T) {
	_, stream, err := interceptor.NewClientInterceptors()
	require.NoError(t, err)
	panicking := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		st, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return panicRecvStream{st}, nil
	}
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		return ss.Send(&testingv1.WatchResponse{})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainStreamInterceptor(stream, panicking),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "k"})
	require.NoError(t, err)
	func() {
		defer func() { t.Logf("recovered: %v", recover()) }()
		_, _ = st.Recv()
	}()
}

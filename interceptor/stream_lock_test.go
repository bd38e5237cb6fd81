package interceptor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// answeredStream is the server stream a proxy hands the handler it leaves
// running after answering the caller itself: the handler may read what the
// caller sent, but whatever it would send back is dropped (the proxy already
// ended the stream).
type answeredStream struct{ grpc.ServerStream }

func (answeredStream) SetHeader(metadata.MD) error  { return nil }
func (answeredStream) SendHeader(metadata.MD) error { return nil }
func (answeredStream) SetTrailer(metadata.MD)       {}
func (answeredStream) SendMsg(any) error            { return nil }

// TestStreamCloseSendAndTrailerDoNotWaitForResolution: while RecvMsg
// resolves a try whose outcome is unknown (its handler still runs, so the
// owner polls an IN_PROGRESS record), Trailer and CloseSend called from
// another goroutine return at once: Trailer with the resolved try's
// trailer, CloseSend having noted the half-close, which the repeat the
// resolution then sends carries after replaying what was sent.
//
// The first try's handler is held until both calls returned, so a Trailer
// or CloseSend that waited for the resolution would never return (the
// Eventually bound only detects that deadlock), whatever the machine's speed.
func TestStreamCloseSendAndTrailerDoNotWaitForResolution(t *testing.T) {
	held, releaseC := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(releaseC) }) }
	var runs, queries atomic.Int64
	var first atomic.Bool
	var inner sync.WaitGroup
	// The proxy answers the first Upload itself once its handler has read
	// what the caller sent and is held: the caller loses the answer (INTERNAL,
	// no header: UNKNOWN) while the record stays IN_PROGRESS.
	proxy := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod != testingv1.TestService_Upload_FullMethodName || !first.CompareAndSwap(false, true) {
			return h(srv, ss)
		}
		inner.Add(1)
		go func() { defer inner.Done(); _ = h(srv, answeredStream{ss}) }()
		<-held
		ss.SetTrailer(metadata.Pairs("try", "1"))
		return grpcstatus.Error(codes.Internal, "proxy: upstream reset")
	})
	countQueries := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == tollgatev1.AttemptService_FenceAttempt_FullMethodName {
			queries.Add(1)
		}
		return h(ctx, req)
	})
	svc := &testsvc.Service{UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		if runs.Add(1) == 1 {
			for range 2 {
				if _, err := st.Recv(); err != nil {
					return err
				}
			}
			close(held)
			<-releaseC
			return shed() // it did nothing: the record becomes FENCED(1), and the owner repeats
		}
		st.SetTrailer(metadata.Pairs("try", "2"))
		n, err := testsvc.DrainUpload(st) // ends only once the caller's side is closed
		if err != nil {
			return err
		}
		return st.SendAndClose(&testingv1.UploadResponse{Count: n})
	}}
	end := recordedServer(t, svc, memoryStore(t), proxy, countQueries)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(30*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}),
	)...))
	ctx, cancel := context.WithCancel(t.Context())
	var callers sync.WaitGroup
	defer func() {
		release()
		cancel()
		callers.Wait()
		inner.Wait()
	}()

	st, err := client.Upload(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.UploadRequest{Value: "a"}))
	require.NoError(t, st.Send(&testingv1.UploadRequest{Value: "b"}))
	resp := &testingv1.UploadResponse{}
	recvDone := make(chan struct{})
	var recvErr error
	callers.Go(func() { defer close(recvDone); recvErr = st.RecvMsg(resp) })
	require.Eventually(t, func() bool { return queries.Load() >= 2 }, 10*time.Second, time.Millisecond,
		"the owner polls the IN_PROGRESS record")

	trailerC, closeC := make(chan metadata.MD, 1), make(chan error, 1)
	callers.Go(func() { trailerC <- st.Trailer() })
	callers.Go(func() { closeC <- st.CloseSend() })
	require.Eventually(t, func() bool { return len(trailerC) == 1 && len(closeC) == 1 }, 10*time.Second, time.Millisecond,
		"Trailer and CloseSend waited for the resolution")
	select {
	case <-recvDone:
		t.Fatalf("the resolution ended while the first try's handler was held: %v", recvErr)
	default:
	}
	require.Equal(t, int64(1), runs.Load(), "not repeated yet")
	require.Equal(t, []string{"1"}, (<-trailerC).Get("try"), "Trailer during the resolution is the resolved try's")
	require.NoError(t, <-closeC)

	release()
	require.Eventually(t, func() bool {
		select {
		case <-recvDone:
			return true
		default:
			return false
		}
	}, 10*time.Second, time.Millisecond, "the repeat never saw the caller's half-close")
	require.NoError(t, recvErr)
	require.Equal(t, int32(2), resp.GetCount(), "the repeat replayed both messages, then the half-close")
	require.Equal(t, int64(2), runs.Load())
	require.Equal(t, []string{"2"}, st.Trailer().Get("try"), "after the repeat, Trailer is the repeat's")
}

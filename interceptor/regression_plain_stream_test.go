package interceptor_test

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// Every stream kind works through NewClientInterceptors placed by hand, as
// the README shows (with StatsHandler and WithDisableRetry). When the flag
// that the stats handler was seen became per connection, the stream owner's
// per-try call state was left without it, and every stream made this way
// panicked on its first try (found by review; no test sent a stream through
// NewClientInterceptors).
func TestStreamsThroughPlainClientInterceptors(t *testing.T) {
	su, ss, err := interceptor.NewServerInterceptors(interceptor.WithTrustedPeer(interceptor.TrustAll))
	require.NoError(t, err)
	svc := &testsvc.Service{
		WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			return st.Send(&testingv1.WatchResponse{})
		},
		UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			for {
				if _, err := st.Recv(); err == io.EOF {
					return st.SendAndClose(&testingv1.UploadResponse{})
				} else if err != nil {
					return err
				}
			}
		},
		ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
			for {
				if _, err := st.Recv(); err == io.EOF {
					return nil
				} else if err != nil {
					return err
				}
				if err := st.Send(&testingv1.ChatResponse{}); err != nil {
					return err
				}
			}
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, grpc.ChainUnaryInterceptor(su), grpc.ChainStreamInterceptor(ss))
	cu, cs, err := interceptor.NewClientInterceptors(interceptor.WithAllowance(3))
	require.NoError(t, err)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainUnaryInterceptor(cu), grpc.WithChainStreamInterceptor(cs),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))

	w, err := client.Watch(t.Context(), &testingv1.WatchRequest{})
	require.NoError(t, err)
	_, err = w.Recv()
	require.NoError(t, err, "server streaming")

	u, err := client.Upload(t.Context())
	require.NoError(t, err)
	require.NoError(t, u.Send(&testingv1.UploadRequest{}))
	_, err = u.CloseAndRecv()
	require.NoError(t, err, "client streaming")

	c, err := client.Chat(t.Context())
	require.NoError(t, err)
	require.NoError(t, c.Send(&testingv1.ChatRequest{}))
	_, err = c.Recv()
	require.NoError(t, err, "bidi streaming")
	require.NoError(t, c.CloseSend())
	_, err = c.Recv()
	require.ErrorIs(t, err, io.EOF)
}

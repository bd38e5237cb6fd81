package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// The stream twin of TestResolutionQueryCarriesDefaultCallOptions: the
// stream owner's FenceAttempt carries no call options at all (queryOpts is
// never set for streams), so it is refused and a committed stream whose
// record is SUCCEEDED ends UNKNOWN instead of COMMITTED.
func TestRegressionStreamResolutionQueryCarriesCallOptions(t *testing.T) {
	var refused atomic.Bool
	auth := func(ctx context.Context) error {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("authorization")) == 0 {
			refused.Store(true)
			return grpcstatus.Error(codes.Unauthenticated, "no credentials")
		}
		return nil
	}
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		if _, err := st.Recv(); err != nil {
			return err
		}
		return st.Send(&testingv1.ChatResponse{})
	}}
	outer := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := auth(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := auth(ss.Context()); err != nil {
				return err
			}
			if err := h(srv, ss); err != nil {
				return err
			}
			return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
		}),
	}
	end := recordedServer(t, svc, memoryStore(t), outer...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithDefaultCallOptions(grpc.PerRPCCredentials(tokenCreds{})))...))
	st, err := client.Chat(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{}))
	_, err = st.Recv()
	require.NoError(t, err)
	_, err = st.Recv()
	o := status.OutcomeOf(err)
	require.False(t, refused.Load(), "the stream's FenceAttempt carries the call options: %v", err)
	require.Equal(t, status.KindCommitted, o.Kind, "%v", err)
}

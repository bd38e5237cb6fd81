package grpcfacts_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"
)

// factsServe starts a plain grpc-go server of desc with handler and returns a
// client connection made with exactly dopts (no retry option implied), and
// the number of times the handler ran.
func factsServe(t *testing.T, handler func(context.Context) (*emptypb.Empty, error), sopts []grpc.ServerOption, dopts ...grpc.DialOption) (*grpc.ClientConn, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(sopts...)
	srv.RegisterService(&desc, func(ctx context.Context) (*emptypb.Empty, error) {
		n.Add(1)
		return handler(ctx)
	})
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet", append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, dopts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); srv.Stop() })
	return conn, &n
}

func factsInvoke(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
	return conn.Invoke(ctx, "/facts.Svc/Call", &emptypb.Empty{}, &emptypb.Empty{}, opts...)
}

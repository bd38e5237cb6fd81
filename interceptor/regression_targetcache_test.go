package interceptor_test

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// TestTargetCacheKeepsNoClosedConn: DialOptions built once and kept (to
// dial again, or in a pool's config) must not keep alive a ClientConn that
// was closed and dropped. The client remembers its last target by name,
// not by connection (an adversarial review found the first version of the
// cache holding the *grpc.ClientConn, with its balancer and resolver).
func TestTargetCacheKeepsNoClosedConn(t *testing.T) {
	leaf := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	opts := interceptor.DialOptions() // kept, as a pool keeps its dial config

	gone := func() weak.Pointer[grpc.ClientConn] {
		conn, err := end.Dial(opts...)
		require.NoError(t, err)
		_, err = testingv1.NewTestServiceClient(conn).Get(t.Context(), &testingv1.GetRequest{})
		require.NoError(t, err)
		require.NoError(t, conn.Close())
		return weak.Make(conn)
	}()
	require.Eventually(t, func() bool {
		runtime.GC()
		return gone.Value() == nil
	}, 10*time.Second, 10*time.Millisecond, "the closed, dropped ClientConn is still reachable")
	runtime.KeepAlive(opts)
}

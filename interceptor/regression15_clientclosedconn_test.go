package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

func requireClosing(t *testing.T, err error) {
	t.Helper()
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonNotSent, o.Reason, "%v", err)
	require.Equal(t, codes.Unavailable, grpcstatus.Code(err))
	require.Contains(t, err.Error(), "the client connection is closing")
}

// A review found that a call on a ClientConn the caller had closed was
// repeated: grpc-go fails it at once with grpc.ErrClientConnClosing and
// never repeats it, but tollgate's owner saw no OutHeader, classified the
// try NOT_SENT and repeated it on the shut-down connection, with backoff,
// until MaxTries. It now ends after the one try, NOT_ADMITTED NOT_SENT (the
// code tollgate gives every call that never left the client) with
// grpc-go's message. Unary and stream alike.
func TestRegression15ClientClosedConn(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	var tries atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		tries.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cc := end.DialT(t, append(interceptor.DialOptions(fastRetry(3)), grpc.WithChainUnaryInterceptor(count))...)
	client := testingv1.NewTestServiceClient(cc)
	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	require.NoError(t, cc.Close())

	tries.Store(0)
	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	requireClosing(t, err)
	require.Equal(t, int64(1), tries.Load(), "a call on a closed ClientConn is not repeated")

	start := time.Now()
	_, err = client.Watch(t.Context(), &testingv1.WatchRequest{})
	requireClosing(t, err)
	require.Less(t, time.Since(start), 100*time.Millisecond, "a stream on a closed ClientConn waits no backoff")
}

package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding/gzip"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// f78bea8 wraps the handler's ServerTransportStream (handlerTransport) so
// that a handler's grpc.SetTrailer loses tollgate-spent. But grpc-go's
// grpc.SetSendCompressor and grpc.ClientSupportedCompressors type-assert
// ServerTransportStreamFromContext(ctx) to *transport.ServerStream
// (server.go of grpc-go v1.85) and fail on any wrapper: every handler
// behind tollgate's interceptor, with or without a store, lost them, unary
// and stream alike. grpc-go documents both for "the context passed to the
// server's handler".
func TestRegression15ServerCompressor(t *testing.T) {
	type got struct {
		names    []string
		namesErr error
		setErr   error
	}
	unary := make(chan got, 1)
	stream := make(chan got, 1)
	svc := &testsvc.Service{
		GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			var g got
			g.names, g.namesErr = grpc.ClientSupportedCompressors(ctx)
			g.setErr = grpc.SetSendCompressor(ctx, gzip.Name)
			unary <- g
			return &testingv1.GetResponse{}, nil
		},
		WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			var g got
			g.names, g.namesErr = grpc.ClientSupportedCompressors(st.Context())
			g.setErr = grpc.SetSendCompressor(st.Context(), gzip.Name)
			stream <- g
			return nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	c := testingv1.NewTestServiceClient(end.DialT(t))

	_, err := c.Get(t.Context(), &testingv1.GetRequest{Key: "k"}, grpc.UseCompressor(gzip.Name))
	require.NoError(t, err)
	g := <-unary
	assert.NoError(t, g.namesErr, "unary handler: grpc.ClientSupportedCompressors")
	assert.Contains(t, g.names, gzip.Name)
	assert.NoError(t, g.setErr, "unary handler: grpc.SetSendCompressor")

	ws, err := c.Watch(t.Context(), &testingv1.WatchRequest{}, grpc.UseCompressor(gzip.Name))
	require.NoError(t, err)
	for {
		if _, err := ws.Recv(); err != nil {
			break
		}
	}
	g = <-stream
	assert.NoError(t, g.namesErr, "stream handler: grpc.ClientSupportedCompressors")
	assert.NoError(t, g.setErr, "stream handler: grpc.SetSendCompressor")
}

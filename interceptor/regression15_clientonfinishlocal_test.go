package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// The README promises that grpc.OnFinish "runs once, as grpc-go promises,
// when the call or stream ends, with its result". grpc-go (v1.85
// newClientStream's deferred endOfClientStream) runs OnFinish even when the
// RPC fails before a stream exists. tollgate's unary and stream interceptors
// return newCall's local refusal (a bad WithCallKey name: MALFORMED_HEADER;
// CALL_KEY_REQUIRED in an IDEMPOTENT handler) before they take the OnFinish
// options out, and never run them: an outer interceptor's in-flight gauge
// or a tracing span that ends in OnFinish stays open for good.
func TestRegression15ClientOnFinishLocalRefusal(t *testing.T) {
	svc := &testsvc.Service{PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		return &testingv1.PutResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	ctx := interceptor.WithCallKey(t.Context(), "not a valid name!")

	var unary, stream atomic.Int64
	_, err := client.Put(ctx, &testingv1.PutRequest{Key: "k"}, grpc.OnFinish(func(error) { unary.Add(1) }))
	require.Error(t, err)
	_, err = client.Chat(ctx, grpc.OnFinish(func(error) { stream.Add(1) }))
	require.Error(t, err)
	require.Equal(t, int64(1), unary.Load(), "unary OnFinish runs once for a call refused locally")
	require.Equal(t, int64(1), stream.Load(), "stream OnFinish runs once for a stream refused locally")
}

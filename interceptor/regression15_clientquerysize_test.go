package interceptor_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found that resolution queries carried the call's own size
// limits (grpc.MaxCallRecvMsgSize, MaxCallSendMsgSize), though an
// AttemptRecord wraps the stored response with the attempt ID, call,
// method, timestamps and status, so it is always larger than the response.
// A response that fits the caller's limit (900 of 1024 bytes), whose answer
// was lost after the commit, is stored SUCCEEDED; the query for it was
// refused by the client's own receive limit, and the call ended UNKNOWN
// instead of returning the stored response. A stored response over the
// limit is still not handed over: the call ends COMMITTED.
func TestRegression15ClientQuerySizeLimit(t *testing.T) {
	var effects, dropped atomic.Int64
	svc := &testsvc.Service{PutFunc: func(_ context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		effects.Add(1)
		return &testingv1.PutResponse{Value: r.GetValue()}, nil
	}}
	lose := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if info.FullMethod == testingv1.TestService_Put_FullMethodName && err == nil && dropped.Add(1) == 1 {
			return nil, grpcstatus.Error(codes.Unavailable, "connection reset after commit")
		}
		return resp, err
	})
	end := recordedServer(t, svc, memoryStore(t), lose)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	value := strings.Repeat("v", 900)
	resp, err := client.Put(t.Context(), &testingv1.PutRequest{Key: "k", Value: value}, grpc.MaxCallRecvMsgSize(1024))
	require.Equal(t, int64(1), effects.Load(), "never twice")
	require.NoError(t, err, "the stored response (%d bytes) fits the caller's 1024-byte limit", len(value)+3)
	require.Equal(t, value, resp.GetValue())
}

func TestRegression15ClientQueryStoredResponseOverLimit(t *testing.T) {
	var effects atomic.Int64
	svc := &testsvc.Service{PutFunc: func(_ context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		effects.Add(1)
		return &testingv1.PutResponse{Value: r.GetValue()}, nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	// The response is over the caller's limit: grpc-go refuses it on the
	// try (client side), the owner resolves, and the record says SUCCEEDED.
	_, err := client.Put(t.Context(), &testingv1.PutRequest{Key: "k", Value: strings.Repeat("v", 2000)}, grpc.MaxCallRecvMsgSize(1024))
	require.Equal(t, int64(1), effects.Load(), "never twice")
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindCommitted, o.Kind, "the effect happened; the response over the limit is not handed over: %v", err)
}

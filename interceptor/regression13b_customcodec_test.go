package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// appCodecV0 is appCodec as a grpc.Codec (String instead of Name), the kind
// grpc.CallCustomCodec takes.
type appCodecV0 struct{ appCodec }

func (*appCodecV0) String() string { return "proto" }

// queryOptions drops ForceCodec, ForceCodecV2 and CallContentSubtype so that
// AttemptService speaks protobuf, but not grpc.CallCustomCodec
// (CustomCodecCallOption), which sets the call's codec the same way
// (c.codec = newCodecV0Bridge(codec)). A caller using it has its query
// marshalled with its own codec: the query fails and a committed call whose
// response is stored ends UNKNOWN.
func TestRegression13bResolutionQueryIgnoresCallCustomCodec(t *testing.T) {
	ledger := newLedger(nil)
	var dropped atomic.Bool
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if info.FullMethod == testingv1.TestService_Apply_FullMethodName && err == nil && dropped.CompareAndSwap(false, true) {
			return nil, grpcstatus.Error(codes.Unavailable, "connection reset after commit")
		}
		return resp, err
	})
	codec := &appCodecV0{}
	end := recordedServer(t, &ledger.Service, memoryStore(t), outer)
	//lint:ignore SA1019 the deprecated option still sets a call's codec, and callers still use it
	custom := grpc.CallCustomCodec(codec)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	), grpc.WithDefaultCallOptions(custom))...))

	resp, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 5})
	require.Equal(t, int64(1), ledger.effects.Load(), "never twice")
	require.Positive(t, codec.used.Load(), "the tries used the caller's codec")
	require.NoError(t, err, "the query must not use the caller's codec")
	require.Equal(t, int64(5), resp.GetTotal(), "the stored response")
}

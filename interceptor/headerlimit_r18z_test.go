package interceptor_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A tollgate client whose request's header list is over the limit the
// server advertises (WithMaxHeaderListSize) is refused by grpc-go before
// anything is sent: INTERNAL "header list size to send violates the
// maximum size … set by server", with no stats OutHeader. No repeat of
// the same request can pass that limit: the owner must end the call, not
// repeat it until its tries, allowance or budget run out.
func TestR18zHeaderListOverTheServersLimitIsNotRepeated(t *testing.T) {
	var ran atomic.Int32
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		ran.Add(1)
		return &testingv1.ApplyResponse{}, nil
	}}
	e := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		interceptor.ServerOptions(interceptor.WithMaxHeaderListSize(4<<10))...)
	var tries atomic.Int32
	count := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		tries.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	opts := append(interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 5})), count)
	client := testingv1.NewTestServiceClient(e.DialT(t, opts...))

	// A small call first, so that the server's SETTINGS have arrived.
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	require.NoError(t, err)
	require.EqualValues(t, 1, ran.Load())
	tries.Store(0)

	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-big", strings.Repeat("a", 8<<10))
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
	require.Error(t, err)
	o := status.OutcomeOf(err)
	t.Logf("err %v, outcome %v %v final=%v, tries %d", err, o.Kind, status.ReasonName(o.Reason), o.Final(), tries.Load())
	require.EqualValues(t, 1, ran.Load(), "the handler ran for an oversized header list")
	require.EqualValues(t, 1, tries.Load(), "the owner repeated a request grpc-go refuses to send for the server's header list limit")
	require.True(t, o.Kind == status.KindFailed || o.Final(),
		"a request no repeat can send must end the call (a definite error, or a final refusal), got %v %v", o.Kind, status.ReasonName(o.Reason))
}

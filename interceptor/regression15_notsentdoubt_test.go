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

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// 10e4f2f made a try that never left the client with a definite code FAILED
// (status.OutcomeOfCall), and decide returns FAILED without conclude, so the
// call's doubt is ignored: an IDEMPOTENT call whose first try reached the
// handler and timed out (UNKNOWN) is repeated at a callee without records,
// and when the repeat fails locally (an inner interceptor's
// INVALID_ARGUMENT, or credentials refused UNAUTHENTICATED) the call ends
// FAILED, "a definite error" (README: FAILED only without the effect), though
// try 1 may have had its effect. DESIGN.md §3.5: "A call's outcome combines
// all its tries"; before 10e4f2f the never-sent repeat was NOT_ADMITTED and
// conclude made it UNKNOWN.
func TestRegression15NotSentDoubt(t *testing.T) {
	var ran atomic.Int64
	svc := &testsvc.Service{PutFunc: func(ctx context.Context, _ *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		ran.Add(1)
		<-ctx.Done() // outlives the client's per-try timeout: try 1's outcome is UNKNOWN
		return nil, ctx.Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...) // no store: no records
	var puts atomic.Int64
	validate := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/tollgate.testing.v1.TestService/Put" && puts.Add(1) > 1 {
			return grpcstatus.Error(codes.InvalidArgument, "request invalid") // never sent
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(
		interceptor.WithoutRetryBudget(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 100 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})),
		grpc.WithChainUnaryInterceptor(validate))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
	require.NoError(t, err)
	_, err = client.Put(ctx, &testingv1.PutRequest{})
	require.Equal(t, int64(1), ran.Load(), "try 1 reached the handler")
	require.GreaterOrEqual(t, puts.Load(), int64(2), "the call was repeated (IDEMPOTENT at a callee without records)")
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind,
		"try 1 ran and its outcome is unknown, yet the call ended %v (%v)", o.Kind, err)
}

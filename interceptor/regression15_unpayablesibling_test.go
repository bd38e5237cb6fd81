package interceptor_test

import (
	"context"
	"sync"
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
// c98709a's unpayable says, below the origin, that a repeat is "sure to be
// refused whatever happens meanwhile" once no unit is free, reserved or held.
// But a unit taken by a sibling call's try still in flight is counted spent,
// and comes back (Allowance.Unsend) when that try turns out never sent. The
// owner now refuses the repeat ALLOWANCE_EXHAUSTED at once, where it used to
// wait its backoff and find the unit back in prepare.
//
// mid has 2 units. Call B takes one, then an inner interceptor fails it
// before it is sent (INVALID_ARGUMENT: FAILED, not repeated; its unit goes
// back). Call A takes the other; leaf refuses its first try QUEUE_FULL
// (retryable). When A decides on its repeat, B is still in flight (free 0,
// reserved 0, held 0): unpayable refuses A, although B's unit is free again
// well before the retry-after leaf asked for (400 ms) ended.
func TestRegression15UnpayableSiblingUnsend(t *testing.T) {
	var aTries atomic.Int64
	aReached := make(chan struct{})
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if r.GetKey() == "a" && aTries.Add(1) == 1 {
			close(aReached)
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.Fields{Message: "leaf is busy", RetryAfter: 400 * time.Millisecond})
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	bInside := make(chan struct{})
	inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*testingv1.GetRequest); ok && r.GetKey() == "b" {
			close(bInside)
			<-aReached
			time.Sleep(100 * time.Millisecond) // A has decided on its repeat by now
			return grpcstatus.Error(codes.InvalidArgument, "inner: refused before sending")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	toLeaf := testingv1.NewTestServiceClient(leafEnd.DialT(t, append(interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	), grpc.WithChainUnaryInterceptor(inner))...))

	var aErr, bErr error
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		var wg sync.WaitGroup
		wg.Go(func() { _, bErr = toLeaf.Get(ctx, &testingv1.GetRequest{Key: "b"}) })
		<-bInside // B took its unit
		_, aErr = toLeaf.Get(ctx, &testingv1.GetRequest{Key: "a"})
		wg.Wait()
		return &testingv1.GetResponse{Value: "ok"}, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithAllowance(2), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	_, err := origin.Get(t.Context(), &testingv1.GetRequest{Key: "mid"})
	require.NoError(t, err)
	require.Equal(t, status.KindFailed, status.OutcomeOf(bErr).Kind, "precondition: B failed before it was sent: %v", bErr)
	require.NoError(t, aErr, "A's repeat was refused at once (%v), though the unit B never sent came back before A's backoff ended", aErr)
	require.Equal(t, int64(2), aTries.Load())
}

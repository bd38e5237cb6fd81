package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A gateway-style handler that forwards its callee's trailer with
// grpc.SetTrailer (grpc-go appends) makes its answer carry two tollgate-spent
// values. Such a trailer does not read, and was taken as absent: in lenient
// accounting an OK call without a report refunds the whole grant, so the
// origin refunded units that were spent and lent them again — more RPCs
// below the origin than the allowance (found by review). A report that does
// not read now holds the grant.
func TestUnreadableSpentTrailerHoldsTheGrant(t *testing.T) {
	var below atomic.Int32 // RPCs that arrived below the origin (dep and leaf)
	leaf := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		below.Add(1)
		return &testingv1.GetResponse{Value: "v"}, nil
	}}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	one := interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}) // each tier lends all it has
	leafClient := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions(one)...))
	dep := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		below.Add(1)
		return leafClient.Get(ctx, r) // spends 1 unit: dep reports tollgate-spent: 1
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions(one)...))
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		var tr metadata.MD
		resp, err := depClient.Get(ctx, r, grpc.Trailer(&tr))
		_ = grpc.SetTrailer(ctx, tr) // a gateway forwarding its upstream's trailer
		return resp, err
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(one)...))

	const allowance = 2
	ctx, err := interceptor.StartAttempt(t.Context(), allowance, 5*time.Second)
	require.NoError(t, err)
	ledger, _ := budget.FromContext(ctx)
	for i := range 3 {
		var tr metadata.MD
		_, err := origin.Get(ctx, &testingv1.GetRequest{Key: "k"}, grpc.Trailer(&tr))
		t.Logf("call %d: err=%v trailer tollgate-spent=%q ledger=%+v below=%d", i, err, tr.Get("tollgate-spent"), ledger.Snapshot(), below.Load())
	}
	require.LessOrEqual(t, below.Load(), int32(allowance), "RPCs below the origin exceed the attempt's allowance")
}

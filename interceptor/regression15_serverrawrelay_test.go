package interceptor_test

import (
	"context"
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

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §2.3/§3.3 let a hop between two tollgate peers forward each
// request to exactly one upstream without speaking tollgate's client: a
// transparent proxy passes the incoming metadata (the tollgate header, so
// the upstream is granted the caller's units) and relays the upstream's
// trailer, tollgate-spent included. Such a proxy may still run tollgate's
// server interceptor (for admission). Before f78bea8 the caller read the
// upstream's tollgate-spent through it. f78bea8 drops tollgate-spent from
// every trailer a handler sets (handlerTransport, serverStream.SetTrailer),
// and the proxy's interceptor reports its own ledger, which lent nothing
// (spent 0: lenient, no trailer): the caller refunds the whole grant
// although its upstream spent a unit of it, and can lend it again — more
// RPCs below the origin than the allowance (§3.3).
func TestRegression15ServerRawRelay(t *testing.T) {
	leaf := &testsvc.Service{GetFunc: okGet}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	leafClient := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions()...))
	// dep spends one unit: it calls leaf once through tollgate's client.
	dep := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return leafClient.Get(ctx, r)
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(depEnd.DialT(t)) // the proxy's own client: no tollgate options
	// The proxy forwards the request with its incoming metadata and relays
	// the upstream's trailer.
	proxy := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		out := metadata.MD{"tollgate": md.Get("tollgate")}
		var tr metadata.MD
		resp, err := plain.Get(metadata.NewOutgoingContext(ctx, out), r, grpc.Trailer(&tr))
		_ = grpc.SetTrailer(ctx, tr)
		return resp, err
	}}
	proxyEnd := testsvc.StartT(t, testsvc.Bufconn, proxy.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(proxyEnd.DialT(t, interceptor.DialOptions()...))

	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	var tr metadata.MD
	_, err = origin.Get(ctx, &testingv1.GetRequest{Key: "k"}, grpc.Trailer(&tr))
	require.NoError(t, err)
	require.Equal(t, int64(1), leaf.Calls("Get"))
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	require.Equal(t, int64(1), snap.Spent+snap.Held,
		"one unit was spent below the proxy (dep called leaf), but the caller's ledger says %+v (trailer %v)", snap, tr)
}

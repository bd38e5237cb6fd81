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
// DESIGN.md §2.3: the callee reports what it and everything below it spent
// in one tollgate-spent trailer; the client reads exactly one value
// (parseSpent), and anything else holds the grant. A handler that relays
// its upstream's trailer metadata to its own caller — the usual transparent
// gateway, grpc.Trailer(&md) on its call then grpc.SetTrailer(ctx, md) —
// forwards the upstream's tollgate-spent, and the server interceptor then
// appends its own (grpc-go's SetTrailer merges): the caller sees two values,
// cannot read either, and holds the whole grant although the call ended
// and said what it spent. The server owns this key on its answers, as the
// client owns the tollgate header it replaces (§2.1: "a gateway that
// forwards incoming metadata must not produce two"); it should drop or
// replace a tollgate-spent the handler set.
func TestRegression15ServerForwardedTrailer(t *testing.T) {
	dep := &testsvc.Service{GetFunc: okGet}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	// The gateway asks its upstream for strict reports, so the upstream's
	// trailer always carries tollgate-spent (here 0).
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions(interceptor.WithStrictAccounting())...))
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		var tr metadata.MD
		resp, err := depClient.Get(ctx, r, grpc.Trailer(&tr))
		_ = grpc.SetTrailer(ctx, tr) // relay the upstream's trailer
		return resp, err
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions()...))

	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	var tr metadata.MD
	_, err = origin.Get(ctx, &testingv1.GetRequest{Key: "k"}, grpc.Trailer(&tr))
	require.NoError(t, err)
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	require.Equal(t, int64(0), snap.Held,
		"the gateway answered OK and spent 1 unit, but its trailer tollgate-spent=%q cannot be read: the whole grant is held (%+v)",
		tr.Get("tollgate-spent"), snap)
	require.Equal(t, int64(1), snap.Spent, "%+v", snap)
}

package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// f78bea8's passPanic ends a passing panic's bookkeeping "as for a
// recovered one": it seals the ledger and finishes the record, but sets no
// tollgate-spent trailer, although the panic's answer (the user's outer
// recovery interceptor's) goes out with whatever trailer was set before it.
// A strict caller (r=1; DESIGN.md §2.3: tollgate-spent is sent "when the
// request carried r=1") that gets no trailer counts its whole grant as
// spent until reconciled — and with no record (a server without a store)
// nothing ever reconciles it. The same server with WithRecovery reports
// tollgate-spent 0 and the caller gets its grant back.
func TestRegression15ServerPanicTrailer(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		panic("handler bug")
	}}
	outerRecovery := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = grpcstatus.Error(codes.Internal, fmt.Sprint("recovered: ", r))
			}
		}()
		return h(ctx, req)
	})
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, append([]grpc.ServerOption{outerRecovery}, serverOpts()...)...)
	c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithStrictAccounting())...))

	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	_, err = c.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
	require.Error(t, err)
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	require.Equal(t, int64(0), snap.Held+snap.Spent,
		"the callee sealed its ledger with nothing spent, but sent no tollgate-spent to the strict caller: %+v", snap)
}

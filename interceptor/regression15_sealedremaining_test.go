package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A review found that the interceptor's ALLOWANCE_EXHAUSTED refusal on a
// sealed ledger reported its free units as remaining. A goroutine that
// outlives its handler finds the handler's ledger sealed; the ledger's own
// refusal (budget.Allowance.Take) leaves units_remaining out, since those
// units went back to the caller with tollgate-spent, but the interceptor's
// said they remained, beside a message saying no unit was free: a caller
// reading units_remaining was told a repeat could be paid for when no take
// on this ledger can ever succeed again.
func TestRegression15SealedRemaining(t *testing.T) {
	leaf := &testsvc.Service{GetFunc: okGet}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	toLeaf := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions()...))
	ledgerErr := make(chan error, 1)
	callErr := make(chan error, 1)
	released := make(chan struct{})
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		go func() {
			<-released // the handler answered: its ledger is sealed
			l, _ := budget.FromContext(ctx)
			ledgerErr <- l.Take()
			_, err := toLeaf.Get(ctx, r)
			callErr <- err
		}()
		return &testingv1.GetResponse{}, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(interceptor.WithAllowance(5))...))
	_, err := origin.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	close(released)

	lo := status.OutcomeOf(<-ledgerErr)
	require.Equal(t, status.ReasonAllowanceExhausted, lo.Reason)
	require.Zero(t, lo.Detail.GetUnitsRemaining(), "the sealed ledger's own refusal reports no unit remaining")
	co := status.OutcomeOf(<-callErr)
	require.Equal(t, status.ReasonAllowanceExhausted, co.Reason)
	require.Zero(t, co.Detail.GetUnitsRemaining(),
		"the interceptor's refusal on the same sealed ledger reports units remaining: %v", co.Detail)
}

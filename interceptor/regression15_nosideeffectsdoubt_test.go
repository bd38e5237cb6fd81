package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A review (hunting a flaky test) found the defect this test guards against
// (fixed since; the text below is its account of the code before the fix).
//
// DESIGN.md §3.5: "A call's outcome combines all its tries: once any try was
// UNKNOWN, ... only a finished record or a FENCED answer can end the call
// NOT_ADMITTED." For a NO_SIDE_EFFECTS method the owner repeats an UNKNOWN
// try without setting its doubt, so a later refusal (here CONCURRENCY_FULL:
// try 1 still holds the only slot) ends the call NOT_ADMITTED and gives the
// grant back, although try 1 reached the handler and its response never
// arrived (TestALostResponseHoldsTheGrant's expectation; that test flaked on
// this when a loaded machine made the last try's preparation find no time).
func TestRegression15OutcomeNoSideEffectsDoubt(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	release, entered := make(chan struct{}), make(chan struct{}, 4)
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		entered <- struct{}{}
		<-release
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithoutRetryBudget(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 200 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 6, 10*time.Second)
	require.NoError(t, err)
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	close(release)
	require.Len(t, entered, 1, "try 1 reached the handler; later tries were refused by admission")
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "try 1 ran and its response never arrived, yet the call ended %v", err)
	l, _ := budget.FromContext(ctx)
	require.Equal(t, int64(6), l.Snapshot().Held, "the grant of a try whose response never arrived stays held")
}

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
	"github.com/tollgate-go/tollgate/status"
)

// A call the retry budget stops is refused NOT_ADMITTED
// RETRY_BUDGET_EXHAUSTED, not final, and callers may come back: it says
// when, the later of the callee's suggestion and the time the budget's floor
// takes to earn a token (jittered upwards, bounded). A storm tester found
// every such refusal without a retry-after, although the last try's
// refusal carried one.
func TestR18RetryBudgetRefusalSaysWhen(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	// One token, earned back at 2 a second: the second call's repeat finds
	// none, and one accrues in at most half a second.
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(2),
		interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(2), budget.WithMaxRetryTokens(1)))...))
	var err error
	for range 2 {
		_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	}
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonRetryBudgetExhausted, o.Reason, "%v", err)
	require.False(t, o.Final())
	ra, ok := status.RetryAfter(err)
	require.True(t, ok, "%v", err)
	require.Greater(t, ra, 100*time.Millisecond, "the floor's refill, not only the callee's 1 ms")
	require.Less(t, ra, 750*time.Millisecond+time.Millisecond, "at most half a second, jittered up by half")
}

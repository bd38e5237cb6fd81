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
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestRetryBudgetExhaustedIsCounted: DESIGN.md §5's
// tollgate.retry_budget.exhausted exists under that name, in calls, and
// counts each repeat the target's retry budget refused; the call that met
// it ends NOT_ADMITTED RETRY_BUDGET_EXHAUSTED. (Review r12: no test read
// this metric.)
func TestRetryBudgetExhaustedIsCounted(t *testing.T) {
	mp, reader := testMeter(t)
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull)
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		interceptor.ServerOptions(interceptor.WithTrustedPeer(interceptor.TrustAll))...)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 5, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
		// One token saved up and none earned: the first repeat spends it,
		// the next is refused (the floor of one a second is too slow to
		// refill it within the call).
		interceptor.WithRetryBudget(budget.WithMaxRetryTokens(1), budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0)),
		interceptor.WithClientMeterProvider(mp))...)
	client := testingv1.NewTestServiceClient(conn)

	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonRetryBudgetExhausted, o.Reason, "%v", err)
	require.EqualValues(t, 2, svc.Calls("Get"), "the first try and the one repeat the token paid for")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, int64(1), counter(rm, "tollgate.retry_budget.exhausted"))
	var unit string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "tollgate.retry_budget.exhausted" {
				unit = m.Unit
			}
		}
	}
	require.Equal(t, "{call}", unit)
}

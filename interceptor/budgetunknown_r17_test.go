package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A try whose response is lost, when the retry budget has no token left for
// its resolution, ends UNKNOWN naming the attempt, as before, and now also
// says why it was not resolved: its reason is RETRY_BUDGET_EXHAUSTED. Before,
// the reason was UNSPECIFIED and only the message said so, so a program could
// not tell this UNKNOWN, which a later query may still resolve, from one no
// query could (a fresh-eyes review of the retry framework).
func TestUnresolvedForLackOfBudgetSaysSo(t *testing.T) {
	release := make(chan struct{})
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if r.GetKey() == "slow" {
			<-release // past the client's per-try timeout: its response is lost to it
		}
		return &testingv1.ApplyResponse{Total: 1}, nil
	}}
	defer close(release)
	end := recordedServer(t, svc, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		oneRetryToken(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 100 * time.Millisecond}),
	)...))

	// Drain the budget's one token: a call refused once, repeated once.
	var shedOnce = make(chan struct{}, 1)
	shedOnce <- struct{}{}
	svc.GetFunc = func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		select {
		case <-shedOnce:
			return nil, shed()
		default:
			return &testingv1.GetResponse{}, nil
		}
	}
	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "drain"})
	require.NoError(t, err, "the repeat took the budget's one token")

	_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "slow", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId())
	require.Equal(t, status.ReasonRetryBudgetExhausted, o.Reason, "%v", err)
	require.False(t, o.Final(), "a later query (a new token) may still resolve it")
}

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
	"github.com/tollgate-go/tollgate/status"
)

// A review found that the owner took a retry-budget token before it knew
// whether the repeat's backoff fitted the deadline: a refusal whose
// retry-after outlasted the attempt spent a token on a repeat never sent.
// Here the budget holds one token and earns none; the first call's refusal
// asks for an hour, and the second call's refusal for a millisecond: the
// second call's repeat must still find its token.
func TestRegression14bNoRetryTokenForARepeatThatCannotFit(t *testing.T) {
	var calls atomic.Int32
	svc := &testsvc.Service{GetFunc: func(_ context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		n := calls.Add(1)
		switch {
		case r.GetKey() == "far":
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Hour))
		case n == 2: // the second call's first try
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3),
		interceptor.WithAttemptTimeout(2*time.Second),
		interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1)))...))

	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "far"})
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "%v", err)
	_, err = client.Get(t.Context(), &testingv1.GetRequest{Key: "near"})
	require.NoError(t, err, "the repeat found the budget's one token")
	require.EqualValues(t, 3, calls.Load())
}

package interceptor_test

import (
	"context"
	"sync"
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

// A review found that a repeat the allowance could not pay for was never
// sent, yet the owner withdrew its retry-budget token (and slept its
// backoff) before it found out. The per-target budget bounds repeats sent
// (README: "repeats and resolutions cost a token"); a token burned for a
// repeat that never left the client is taken from other attempts to the
// same target, which then cannot repeat.
//
// mid's client to leaf has a retry budget of exactly one token that never
// refills. Attempt A reaches mid with 1 unit: its call to leaf takes it, is
// refused QUEUE_FULL, and cannot be repeated (no unit) — leaf sees one
// call. Attempt B reaches mid with 5 units; its first try is refused, and
// its repeat (which the unused token pays for) must be sent.
func TestRegression15RetryToken(t *testing.T) {
	var leafCalls, flaky atomic.Int64
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		leafCalls.Add(1)
		if r.GetKey() == "busy" || (r.GetKey() == "flaky" && flaky.Add(1) == 1) {
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.Fields{Message: "leaf is busy"})
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	toLeaf := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
		interceptor.WithRetryBudget(budget.WithMaxRetryTokens(1), budget.WithMinRetriesPerSecond(0), budget.WithRetryRatio(0)),
	)...))
	var (
		mu      sync.Mutex
		midErrs = map[string]error{}
	)
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		_, err := toLeaf.Get(ctx, r)
		mu.Lock()
		midErrs[r.GetKey()] = err
		mu.Unlock()
		if err != nil {
			return nil, err
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	dial := func(units int64) testingv1.TestServiceClient {
		return testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(
			interceptor.WithAllowance(units), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	}

	_, _ = dial(1).Get(t.Context(), &testingv1.GetRequest{Key: "busy"})
	require.Equal(t, int64(1), leafCalls.Load(), "attempt A had one unit below mid: one call reached leaf, no repeat was sent")
	require.Equal(t, status.ReasonAllowanceExhausted, status.OutcomeOf(midErrs["busy"]).Reason)

	_, err := dial(5).Get(t.Context(), &testingv1.GetRequest{Key: "flaky"})
	mu.Lock()
	berr := midErrs["flaky"]
	mu.Unlock()
	require.NoError(t, berr, "attempt B's repeat was refused: the only retry token went to attempt A's repeat, which was never sent")
	require.NoError(t, err)
}

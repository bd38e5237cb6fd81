package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A review found that an attempt older than the store's TTL (5 min by
// default) can make no recorded call, even the first try of a fresh call
// whose deadline lies well ahead, and that the refusal did not say why.
// The limit itself stands: a record lives TTL after its last write, and a
// fence's tombstone knows no deadline, so after ts − skew + TTL the absence
// of a record no longer proves that no earlier try ran (DESIGN.md §3.8).
// The refusal now says so, the call ends NOT_ADMITTED (nobody else can have
// sent the first try of a numbered key) and the handler never runs; the
// README states the limit.
//
// Scaled down: TTL 200 ms, MaxAttemptDeadline and the server's
// WithMaxAttemptTime 100 ms (a consistent configuration), an attempt of 5 s
// whose first call comes 300 ms after it was created.
func TestRegression15ServerOldAttempt(t *testing.T) {
	p := idempotency.Policy{Skew: 0, Grace: 10 * time.Millisecond, MaxAttemptDeadline: 100 * time.Millisecond,
		TTL: 200 * time.Millisecond, MaxResponseBytes: 1 << 10}
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	var runs atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return &testingv1.ApplyResponse{Total: 1}, nil
	}}
	end := mintedServer(t, svc, store, interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0),
		interceptor.WithMaxAttemptTime(p.MaxAttemptDeadline))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	time.Sleep(5 * time.Millisecond) // the attempt is created after the store's horizon
	ctx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	time.Sleep(p.TTL + 100*time.Millisecond) // local work before the attempt's first call

	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason, "%v", err)
	require.True(t, o.Final(), "%v", err)
	require.Contains(t, err.Error(), "longer ago than the store keeps records", "the refusal says why")
	require.Equal(t, int64(0), runs.Load(), "the handler never ran")
}

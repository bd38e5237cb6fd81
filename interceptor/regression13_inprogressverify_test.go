package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// TestRegression13VerifyingTryAfterInProgressDoesNotCount: a call keyed
// explicitly (a ballot across runs of the calling handler) meets
// ATTEMPT_IN_PROGRESS — another run's try of the same key is running — and
// polls until the record finishes SUCCEEDED. Because the key is explicit,
// the owner does not replay the polled record but sends a verifying try
// (owner.go resolve sets w.verify). On the UNKNOWN path the first verifying
// try of a call does not count against the policy's tries (decide:
// uncounted = w.verify && !w.verified), and owner.verify's doc says so of
// "the first such try of a call"; on the ATTEMPT_IN_PROGRESS path decide
// ignores w.verify, so the verifying try counts. Under MaxTries 1 (a layer
// that allows one try) proceed then stops, and the call ends UNKNOWN
// although its record says SUCCEEDED and one uncounted try would have
// returned the stored response.
//
// Expected: OK with the stored response (total 1), the handler run once.
func TestRegression13VerifyingTryAfterInProgressDoesNotCount(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ledger := newLedger(func(context.Context, *testingv1.ApplyRequest) {
		close(entered)
		<-release // the first run's try is IN_PROGRESS until the query came
	})
	// Outermost: once the second call's owner queried the record (and was
	// answered IN_PROGRESS), the first run's try finishes.
	onFence := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if info.FullMethod == "/tollgate.v1.AttemptService/FenceAttempt" {
			once.Do(func() { close(release) })
		}
		return resp, err
	}
	end := recordedServer(t, &ledger.Service, memoryStore(t), grpc.ChainUnaryInterceptor(onFence))
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}),
		interceptor.WithoutRetryBudget())...)
	client := testingv1.NewTestServiceClient(conn)

	ctx, err := interceptor.StartAttempt(t.Context(), 3, 10*time.Second)
	require.NoError(t, err)
	kctx := interceptor.WithCallKey(ctx, "pay")
	req := &testingv1.ApplyRequest{Key: "acct", Amount: 1}

	first := make(chan error, 1)
	go func() {
		_, err := client.Apply(kctx, req)
		first <- err
	}()
	<-entered

	// Another run of the same ballot: its first try finds the record running.
	resp, err := client.Apply(kctx, req)
	require.NoError(t, <-first)
	require.Equal(t, int64(1), ledger.effects.Load(), "the handler ran once")
	require.NoError(t, err, "the record finished SUCCEEDED, yet the call ended %v (reason %v): its verifying try counted against MaxTries 1",
		status.OutcomeOf(err).Kind, status.OutcomeOf(err).Reason)
	require.Equal(t, int64(1), resp.GetTotal())
}

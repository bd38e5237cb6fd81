package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/status"
)

// Two runs of a calling handler (a re-run after the first one's caller gave
// up, say) send the same explicitly keyed call of one attempt while the
// first run's try still runs. The second run's try is refused
// ATTEMPT_IN_PROGRESS by the record; its owner, in doubt, resolves: it polls
// the record until the first try finishes, then asks the store again (an
// explicit key's record may hold another request's result), which replays
// the first try's response. The handler runs once; both runs get its answer.
func TestExplicitKeyOfTwoRunsWaitsForTheRunningTry(t *testing.T) {
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	ledger := newLedger(nil)
	ledger.ApplyFunc = func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
		return &testingv1.ApplyResponse{Total: 10 + r.GetAmount()}, nil
	}
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 10, 10*time.Second)
	require.NoError(t, err)
	ctx = interceptor.WithCallKey(ctx, "charge")
	req := &testingv1.ApplyRequest{Key: "acct", Amount: 5}

	first := make(chan error, 1)
	var firstResp *testingv1.ApplyResponse
	go func() {
		var err error
		firstResp, err = client.Apply(ctx, req)
		first <- err
	}()
	<-started
	second := make(chan error, 1)
	var secondResp *testingv1.ApplyResponse
	go func() {
		var err error
		secondResp, err = client.Apply(ctx, req)
		second <- err
	}()
	// The second run's try meets the running record; let it poll a while.
	time.Sleep(50 * time.Millisecond)
	close(release)
	require.NoError(t, <-first)
	err = <-second
	require.NoError(t, err, "the second run is answered from the first try's record: %v", status.OutcomeOf(err))
	require.Equal(t, int32(1), runs.Load(), "the handler ran once")
	require.Equal(t, int64(15), firstResp.GetTotal())
	require.Equal(t, int64(15), secondResp.GetTotal(), "the second run gets the recorded response")
}

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

// WithResolutionGrace: "The grace also runs past the caller's context's
// deadline ... a call in doubt at its deadline may return up to the grace
// later." owner.resolve bounds its queries by the *attempt's* deadline plus
// the grace (qctx), and no longer by the caller's context's deadline at all
// (the AfterFunc only reacts to cancellation). A call whose context deadline
// is earlier than its attempt's — a call under StartAttempt with a per-call
// timeout, or a handler's downstream call with its own timeout — keeps
// polling an IN_PROGRESS record until the attempt's deadline + grace, far
// past its own deadline + grace.
func TestRegression13bResolutionBoundedByCallersDeadlinePlusGrace(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		select { // runs detached until the attempt's deadline: IN_PROGRESS meanwhile
		case <-release:
		case <-ctx.Done():
		}
		return &testingv1.ApplyResponse{Total: 1}, nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	const grace = 300 * time.Millisecond
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithResolutionGrace(grace),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}),
	)...))

	actx, err := interceptor.StartAttempt(t.Context(), 4, 2*time.Minute)
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(actx, 300*time.Millisecond) // this call's own deadline
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := client.Apply(cctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
		done <- err
	}()
	<-cctx.Done()
	// deadline + grace is 300 ms from now; allow thirty times that.
	timer := time.NewTimer(30 * grace)
	defer timer.Stop()
	select {
	case err := <-done:
		require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	case <-timer.C:
		t.Fatalf("the call's context deadline passed %v ago and it is still resolving (grace %v): it waits for the attempt's deadline (2 min) + grace", 30*grace, grace)
	}
}

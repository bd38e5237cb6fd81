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
	"google.golang.org/grpc/metadata"
)

// TestConcurrentTriesWhileTheHandlerRuns: DESIGN.md §3.7,
// "a running one answers ATTEMPT_IN_PROGRESS". TestConcurrentTriesOfOneCallRunTheHandlerOnce
// uses a handler that returns at once, so its 50 tries rarely overlap a
// running try: it passes even when the store lets a try start over a record
// IN_PROGRESS. Here the first try's handler is held running while 49 more
// tries of the same call (tries 1–3) arrive: every one must be answered
// ATTEMPT_IN_PROGRESS without running the handler.
func TestConcurrentTriesWhileTheHandlerRuns(t *testing.T) {
	release := make(chan struct{})
	ledger := newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t)) // raw gRPC: the test plays the owner
	actx, err := interceptor.StartAttempt(t.Context(), 0, 20*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	hdr := "a=" + a.ID + ";c=0;d=" + itoa(a.Deadline.UnixMilli())

	first := make(chan error, 1)
	go func() {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", hdr+";t=1")
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 5})
		first <- err
	}()
	// Wait (not a timing claim) until the first try's handler has made its
	// effect and is held running.
	for ledger.effects.Load() == 0 {
		time.Sleep(time.Millisecond)
	}

	const n = 49
	var wg sync.WaitGroup
	results := make([]error, n)
	for i := range n {
		wg.Go(func() {
			// A bound only so that a regression (a try that runs the held
			// handler again) ends the test instead of hanging it.
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", hdr+";t="+itoa(int64(1+i%3)))
			_, results[i] = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 5})
		})
	}
	wg.Wait()
	ran := ledger.effects.Load()
	close(release)
	require.Equal(t, int64(1), ran, "the handler ran once while its record was IN_PROGRESS")
	require.NoError(t, <-first)
	for i, err := range results {
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind, "try %d: %v", i, err)
		require.Equal(t, status.ReasonAttemptInProgress, o.Reason, "try %d: %v", i, err)
	}
}

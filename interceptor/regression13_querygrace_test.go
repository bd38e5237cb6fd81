package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// graceStore signals when a try's record is finished, and holds the first
// FenceAttempt until released (or until the query is cancelled).
type graceStore struct {
	*idempotency.MemoryStore
	finished chan struct{}
	entered  chan struct{}
	release  chan struct{}
}

func (s *graceStore) Finish(ctx context.Context, req idempotency.FinishRequest) error {
	err := s.MemoryStore.Finish(ctx, req)
	select {
	case s.finished <- struct{}{}:
	default:
	}
	return err
}

func (s *graceStore) Fence(ctx context.Context, key idempotency.Key, through uint32) (*tollgatev1.AttemptRecord, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.MemoryStore.Fence(ctx, key, through)
}

// DESIGN.md §3.1: resolution queries run "on a detached context with a
// bounded grace after the deadline". At the origin the attempt's deadline is
// the caller's context deadline (the usual way to set one), so the grace is
// exactly for the time after that context expired. owner.resolve cancels the
// query as soon as the caller's context ends for any reason — its deadline
// included — so a try that was resolvable a moment after the deadline ends
// UNKNOWN ("the caller stopped waiting"), the worst answer, although the
// caller never cancelled.
func TestRegression13QueryGraceAfterCallerDeadline(t *testing.T) {
	store := &graceStore{MemoryStore: memoryStore(t),
		finished: make(chan struct{}, 1), entered: make(chan struct{}, 1), release: make(chan struct{})}
	handlerRelease := make(chan struct{})
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		<-handlerRelease // slow, detached from the client's per-try timeout
		return &testingv1.ApplyResponse{Total: 42}, nil
	}}
	end := recordedServer(t, svc, store)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(time.Minute),
		interceptor.WithResolutionGrace(time.Minute),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1, PerTryTimeout: 200 * time.Millisecond}),
	)...))

	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	type result struct {
		resp *testingv1.ApplyResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
		done <- result{resp, err}
	}()

	<-store.entered       // the try timed out on the client; its resolution began
	close(handlerRelease) // the detached handler finishes: SUCCEEDED, response kept
	<-store.finished
	<-ctx.Done() // the attempt's deadline (the caller's context deadline) passes
	// Well inside the grace (1 min), the store answers.
	time.Sleep(300 * time.Millisecond)
	close(store.release)

	r := <-done
	require.NoError(t, r.err, "the query is exempt from the deadline for the grace: the stored response answers the call")
	require.Equal(t, int64(42), r.resp.GetTotal())
}

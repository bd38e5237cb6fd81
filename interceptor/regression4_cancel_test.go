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
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// slowFence is a store whose Fence answers only once released (a slow store,
// a congested callee).
type slowFence struct {
	*idempotency.MemoryStore
	entered chan struct{}
	release chan struct{}
}

func (s *slowFence) Fence(ctx context.Context, key idempotency.Key, through uint32) (*tollgatev1.AttemptRecord, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
	return s.MemoryStore.Fence(ctx, key, through)
}

// A caller that cancels while the resolution query is in flight must get
// its call back at once (owner.resolve: "a cancelled caller returns at
// once"), not when the query answers or at deadline + grace.
func TestRegressionCancelDuringInFlightQuery(t *testing.T) {
	store := &slowFence{MemoryStore: memoryStore(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(store.release)
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, grpcstatus.Error(codes.Internal, "boom after a possible effect") // UNKNOWN
	}}
	end := recordedServer(t, svc, store)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAttemptTimeout(20*time.Second))...))
	ctx, cancel := context.WithCancel(t.Context())
	var err error
	var returned atomic.Bool
	go func() {
		_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
		returned.Store(true)
	}()
	select {
	case <-store.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no resolution query was sent")
	}
	cancel()
	require.Eventually(t, returned.Load, 10*time.Second, time.Millisecond, "a cancelled caller returns at once even while its query is in flight")
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
}

// The same for a stream: its Recv resolves the failed try holding the
// stream's lock, and the caller's cancellation must end it at once.
func TestRegressionCancelStreamDuringInFlightQuery(t *testing.T) {
	store := &slowFence{MemoryStore: memoryStore(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(store.release)
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		return grpcstatus.Error(codes.Internal, "boom after a possible effect") // UNKNOWN, nothing sent
	}}
	end := recordedServer(t, svc, store)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAttemptTimeout(20*time.Second))...))
	ctx, cancel := context.WithCancel(t.Context())
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	var returned atomic.Bool
	var rerr error
	go func() { _, rerr = st.Recv(); returned.Store(true) }()
	select {
	case <-store.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no resolution query was sent")
	}
	cancel()
	require.Eventually(t, returned.Load, 10*time.Second, time.Millisecond, "Recv returns once the caller cancelled, even while the query is in flight")
	t.Log(rerr)
}

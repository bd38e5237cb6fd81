package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// A caller that cancels a recorded call gets it back at once, UNKNOWN with
// its attempt ID, while the detached handler goes on. The handler is held
// until the call has returned: a call that waited for the resolution would
// never return, whatever the machine's speed.
func TestRegressionCancelledUnaryReturnsPromptly(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		close(started)
		<-release // a slow state-changing handler, detached from the caller
		return &testingv1.ApplyResponse{}, nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAttemptTimeout(5*time.Second))...))
	ctx, cancel := context.WithCancel(t.Context())
	var err error
	var returned atomic.Bool
	go func() {
		_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
		returned.Store(true)
	}()
	<-started
	cancel()
	require.Eventually(t, returned.Load, 10*time.Second, time.Millisecond, "a cancelled call returns without waiting for its resolution")
	close(release)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId())
}

// A cancelled stream's Recv returns once the caller cancelled.
func TestRegressionCancelledStreamRecvReturnsPromptly(t *testing.T) {
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		<-st.Context().Done()
		return st.Context().Err()
	}}
	end := recordedServer(t, svc, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAttemptTimeout(30*time.Second))...))
	ctx, cancel := context.WithCancel(t.Context())
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{}))
	var returned atomic.Bool
	go func() { _, _ = st.Recv(); returned.Store(true) }()
	cancel()
	require.Eventually(t, returned.Load, 10*time.Second, time.Millisecond, "Recv returns once the caller cancelled, long before the 30 s deadline")
}

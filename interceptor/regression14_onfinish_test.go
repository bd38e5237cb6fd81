package interceptor_test

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// A review found that grpc.OnFinish promises its callback "will only be called
// once by gRPC", with the status of the RPC; interceptors above tollgate's
// (metrics, in-flight gauges) add it to learn when the call they see ends.
// owner.run passes the caller's call options to every try (owner.go:185),
// so the callback runs once per try, the first time with the refusal of a
// try the caller never sees, while the call goes on. queryOptions drops
// OnFinish for resolution queries, for that very reason; tries keep it.
func TestRegression14ClientOnFinishRunsOncePerCall(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if runs.Add(1) == 1 {
			return nil, shed() // without effect: repeated
		}
		return &testingv1.ApplyResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	var mu sync.Mutex
	var finished []error
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1}, grpc.OnFinish(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		finished = append(finished, err)
	}))
	require.NoError(t, err)
	require.Equal(t, int64(2), runs.Load(), "repeated once")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, finished, 1, "OnFinish ran per try: %v", finished)
	require.NoError(t, finished[0], "with the call's status")
}

// A stream's OnFinish runs once too, when the stream ends, with its result
// (nil for OK): not when a try that was repeated ended.
func TestRegression14ClientStreamOnFinishRunsOncePerCall(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		if runs.Add(1) == 1 {
			return shed() // before any message: repeated
		}
		return ss.Send(&testingv1.WatchResponse{})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	var mu sync.Mutex
	var finished []error
	st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "k"}, grpc.OnFinish(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		finished = append(finished, err)
	}))
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	_, err = st.Recv()
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, int64(2), runs.Load(), "repeated once")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, finished, 1, "OnFinish ran per try: %v", finished)
	require.NoError(t, finished[0], "with the stream's status")
}

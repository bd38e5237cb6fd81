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
	"google.golang.org/grpc"
)

// slowRecv is a stream below tollgate's whose first RecvMsg, once it has
// its message, returns only after the try's context ended: a RecvMsg under
// way at the try's deadline that hands the caller a message that arrived
// before it (an inner interceptor, a slow codec, or just the scheduler do
// the same).
type slowRecv struct {
	grpc.ClientStream
	ctx   context.Context
	first atomic.Bool
}

func (s *slowRecv) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil && s.first.CompareAndSwap(false, true) {
		<-s.ctx.Done()
		time.Sleep(50 * time.Millisecond) // grpc-go has run the try's OnFinish
	}
	return err
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// f41cc30 ends a stream nothing reads at its try's deadline from the try's
// OnFinish (tryFinished), but leaves it alone when a RecvMsg is under way
// ("a RecvMsg ... sees it"). A RecvMsg under way at the deadline may return
// a message that arrived before the cut, not the cut: it does not end the
// stream, and grpc-go runs the try's OnFinish only once. If the caller then
// reads no more (it had what it wanted, with a context without a deadline),
// nothing ever ends the stream: the caller's OnFinish never runs, the span
// and the try's grant stay open, and Context() never ends — what f41cc30 set
// out to fix, grpc-go ending its stream at the deadline, read or not. The
// 200-stream stress in review_stream_stress_test.go hits it without any
// inner interceptor (about one run in three).
func TestRegression15StreamRecvAtDeadline(t *testing.T) {
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		if err := sendWatch(ss, 1); err != nil {
			return err
		}
		<-ss.Context().Done()
		return ss.Context().Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		st, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &slowRecv{ClientStream: st, ctx: ctx}, nil
	}
	conn := end.DialT(t, append(interceptor.DialOptions(fastRetry(3), interceptor.WithAttemptTimeout(300*time.Millisecond)),
		grpc.WithChainStreamInterceptor(inner))...)
	ctx, cancel := context.WithCancel(context.Background()) // no deadline of the caller's own
	defer cancel()
	finished := make(chan error, 2)
	st, err := testingv1.NewTestServiceClient(conn).Watch(ctx, &testingv1.WatchRequest{Key: "k"},
		grpc.OnFinish(func(err error) { finished <- err }))
	require.NoError(t, err)
	m, err := st.Recv()
	require.NoError(t, err, "the message that arrived before the deadline")
	require.Equal(t, "0", m.GetValue())
	// The caller reads no more.
	select {
	case <-finished:
	case <-time.After(3 * time.Second):
		t.Fatal("the stream, cut at its attempt's deadline while a RecvMsg was under way, never ended: OnFinish did not run")
	}
	select {
	case <-st.Context().Done():
	case <-time.After(time.Second):
		t.Fatal("the stream's Context never ended")
	}
}

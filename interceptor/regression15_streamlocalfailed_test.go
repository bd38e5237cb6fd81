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
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A Chat stream (side effects) whose first message the handler applied and
// answered, then ended UNAVAILABLE (non-definite: UNKNOWN): the call has
// taken effect. Its status arrived, unread, when the caller's next SendMsg
// fails locally with a definite code (a validation interceptor below
// tollgate's). SendMsg settles the try with that local error, and the
// delivery being PeerStatus, OutcomeOfCall types it as the peer's definite
// answer: the stream ends FAILED INVALID_ARGUMENT. The README says FAILED is
// returned only without an effect; the callee's own answer was UNKNOWN.
func TestRegression15StreamLocalFailed(t *testing.T) {
	var applied atomic.Int64
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		applied.Add(1) // the effect
		if err := st.Send(&testingv1.ChatResponse{Value: m.GetValue()}); err != nil {
			return err
		}
		return grpcstatus.Error(codes.Unavailable, "the store timed out after the write")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		st, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return r8Validating{st}, nil
	}
	seen := trailerSeen{ch: make(chan struct{}, 1)}
	conn := end.DialT(t, append(interceptor.DialOptions(fastRetry(3), interceptor.WithAttemptTimeout(10*time.Second)),
		grpc.WithChainStreamInterceptor(inner), grpc.WithStatsHandler(seen))...)
	finished := make(chan error, 1)
	st, err := testingv1.NewTestServiceClient(conn).Chat(t.Context(), grpc.OnFinish(func(err error) { finished <- err }))
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{Value: "a"}))
	m, err := st.Recv()
	require.NoError(t, err)
	require.Equal(t, "a", m.GetValue())
	require.Equal(t, int64(1), applied.Load(), "precondition: the handler applied the first message")
	select {
	case <-seen.ch: // the handler's UNAVAILABLE arrived, unread
	case <-time.After(10 * time.Second):
		t.Fatal("precondition: the server's status never arrived")
	}

	serr := st.Send(&testingv1.ChatRequest{Value: "bad"})
	require.Error(t, serr)
	var fin error
	select {
	case fin = <-finished:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end")
	}
	_, rerr := st.Recv()
	t.Logf("serr=%v\nfin=%v (%v)\nrerr=%v", serr, fin, status.OutcomeOf(fin).Kind, rerr)
	for _, e := range []error{serr, fin, rerr} {
		require.NotEqual(t, status.KindFailed, status.OutcomeOf(e).Kind,
			"the handler applied a message of this stream, yet it ends FAILED (README: FAILED only without an effect): %v", e)
	}
}

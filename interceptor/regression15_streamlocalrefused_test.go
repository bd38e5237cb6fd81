package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// d287929: a stream's SendMsg that fails locally after the try's status
// arrived unread now counts the try as maybe sent (grant held, UNKNOWN),
// whatever that status was. Here the callee refused the stream without
// effect (a shed NOT_ADMITTED: nothing ran, nothing spent) before the
// caller sent anything; the caller's first SendMsg is refused by a
// validation interceptor below tollgate. The inner stream is still alive
// (nothing below grpc-go failed), so the status that arrived can be read,
// and it proves nothing ran; yet the stream ends UNKNOWN ("may have taken
// effect") and the callee's grant stays held for good (nothing later reads
// the status: the stream is ended).
func TestRegression15StreamLocalRefused(t *testing.T) {
	svc := &testsvc.Service{ChatFunc: func(grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		return shed()
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
	conn := end.DialT(t, append(interceptor.DialOptions(fastRetry(1)),
		grpc.WithChainStreamInterceptor(inner), grpc.WithStatsHandler(seen))...)
	actx, err := interceptor.StartAttempt(t.Context(), 4, time.Minute)
	require.NoError(t, err)
	ledger, _ := budget.FromContext(actx)
	st, err := testingv1.NewTestServiceClient(conn).Chat(actx)
	require.NoError(t, err)
	select {
	case <-seen.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("precondition: the server's status never arrived")
	}
	serr := st.Send(&testingv1.ChatRequest{Value: "bad"})
	require.Error(t, serr)
	snap := ledger.Snapshot()
	o := status.OutcomeOf(serr)
	t.Logf("Send: %v (%v); ledger %+v", serr, o.Kind, snap)
	require.NotEqual(t, status.KindUnknown, o.Kind, "the callee refused the stream without effect, yet it ends UNKNOWN: %v", serr)
	require.Equal(t, int64(0), snap.Held, "the callee's refusal proves nothing was spent, yet its grant stays held: %+v", snap)
}

package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// panicOnSend is an inner interceptor's stream whose SendMsg panics.
type panicOnSend struct{ grpc.ClientStream }

func (panicOnSend) SendMsg(any) error { panic("an inner interceptor panics in SendMsg") }

// A review found that a panic below the interceptor in an inner
// interceptor's SendMsg, while the owner replayed what the caller sent on a
// repeat, happened on tollgate's own replay goroutine, where no caller can
// recover it: the process died. It is now recovered there, logged, and the
// stream ends as a panic below ends it.
func TestRegression14dPanicDuringReplayEndsTheStream(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{LookupFunc: func(ss grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error {
		if runs.Add(1) == 1 {
			return status.NotAdmitted(status.ReasonQueueFull) // before any response: repeated
		}
		_, err := ss.Recv() // the replayed request, which never comes
		return err
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	var opened atomic.Int32
	inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		st, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || opened.Add(1) == 1 {
			return st, err
		}
		return panicOnSend{st}, nil // the repeat's replay panics
	}
	_, stream, err := interceptor.NewClientInterceptors(fastRetry(3))
	require.NoError(t, err)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainStreamInterceptor(stream, inner),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))
	st, err := client.Lookup(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.LookupRequest{Key: "k"}))
	_, err = st.Recv()
	require.Error(t, err)
	require.NotEqual(t, status.KindOK, status.OutcomeOf(err).Kind)
	require.NotEmpty(t, status.OutcomeOf(err).Detail.GetAttemptId(), "a typed result naming the attempt: %v", err)
	require.EqualValues(t, 2, opened.Load(), "the repeat was opened, and its replay panicked")
}

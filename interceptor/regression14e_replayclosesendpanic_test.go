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

// panicOnCloseSend is an inner interceptor's stream whose CloseSend panics.
type panicOnCloseSend struct{ grpc.ClientStream }

func (panicOnCloseSend) CloseSend() error { panic("an inner interceptor panics in CloseSend") }

// After 0798b63 a panic in an inner interceptor's SendMsg during the replay
// goroutine is recovered; but the same goroutine then closes the repeat's
// side (openLocked → st.CloseSend) outside the recover, when the caller had
// closed its own: a panic there still ends the process.
func TestRegression14ePanicInCloseSendAfterReplayEndsTheStream(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{LookupFunc: func(ss grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error {
		if runs.Add(1) == 1 {
			return status.NotAdmitted(status.ReasonQueueFull) // before any response: repeated
		}
		return nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	var opened atomic.Int32
	inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		st, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || opened.Add(1) == 1 {
			return st, err
		}
		return panicOnCloseSend{st}, nil // the repeat's close after its replay panics
	}
	_, stream, err := interceptor.NewClientInterceptors(fastRetry(3))
	require.NoError(t, err)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainStreamInterceptor(stream, inner),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))
	st, err := client.Lookup(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.LookupRequest{Key: "k"}))
	require.NoError(t, st.CloseSend())
	_, err = st.Recv()
	require.Error(t, err)
	require.NotEqual(t, status.KindOK, status.OutcomeOf(err).Kind)
	require.EqualValues(t, 2, opened.Load(), "the repeat was opened, and its close panicked")
}

package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// The grpc-go behaviour the server interceptor's bound on a stream's first
// receive rests on (server.go, receiveFirst), checked on the grpc-go this
// module builds with, without tollgate: a ServerStream's RecvMsg cannot be
// cancelled, but a stream interceptor that returns while another goroutine
// is blocked in RecvMsg ends the stream with the status it returned (and
// the trailer it set, concurrently with that RecvMsg: -race checks it), not
// the one RecvMsg's failure would write, and that RecvMsg then returns, with
// the client's stream still open and its context live: the goroutine ends
// with the stream's teardown. TestMain's goleak checks that nothing
// outlives the test.
func TestR16SrvGRPCEndsABlockedRecvMsgWhenItsInterceptorReturns(t *testing.T) {
	type recvEnd struct{ err error }
	recvs := make(chan recvEnd, 1)
	release := make(chan struct{})
	intercept := func(_ any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, _ grpc.StreamHandler) error {
		go func() {
			err := ss.RecvMsg(new(testingv1.ConsumeRequest))
			recvs <- recvEnd{err}
		}()
		<-release                                           // the client has opened the stream and sends nothing
		time.Sleep(20 * time.Millisecond)                   // RecvMsg is, almost surely, blocked by now
		ss.SetTrailer(metadata.Pairs("r16-trailer", "set")) // beside the blocked RecvMsg
		return grpcstatus.Error(codes.DeadlineExceeded, "r16: the interceptor's own status")
	}
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{}).Register, grpc.StreamInterceptor(intercept))
	conn := end.DialT(t)

	for i := range 5 {
		ctx, cancel := context.WithCancel(t.Context()) // no deadline: only the server ends the stream
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
		require.NoError(t, err)
		release <- struct{}{}
		err = s.RecvMsg(new(testingv1.ConsumeResponse))
		st := grpcstatus.Convert(err)
		require.Equal(t, codes.DeadlineExceeded, st.Code(), "stream %d: %v", i, err)
		require.Equal(t, "r16: the interceptor's own status", st.Message(), "stream %d: the interceptor's status, not RecvMsg's", i)
		require.Equal(t, []string{"set"}, s.Trailer().Get("r16-trailer"), "stream %d", i)

		// The client has not cancelled: the blocked RecvMsg returned because
		// the stream ended. The wait is only a guard against a hang.
		select {
		case r := <-recvs:
			require.Error(t, r.err, "stream %d: no request came", i)
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d: the blocked RecvMsg did not return when its interceptor did", i)
		}
		require.NoError(t, ctx.Err(), "stream %d: the client's context is live", i)
		cancel()
	}
}

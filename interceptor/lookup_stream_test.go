package interceptor_test

import (
	"io"
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

// A bidi stream of a NO_SIDE_EFFECTS method whose server answers one message
// and ends while the client is still sending: the client's SendMsg sees the
// end, tollgate's owner reads ahead (a response header does not commit such
// a stream, a message does) and keeps the message it read for the caller's
// next RecvMsg, which gets it as grpc-go would deliver it, then the status.
// The message committed the stream: it is not repeated.
func TestNoSideEffectsBidiHandsOverAMessageReadAhead(t *testing.T) {
	ended := make(chan struct{})
	svc := &testsvc.Service{LookupFunc: func(st grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error {
		defer close(ended)
		r, err := st.Recv()
		if err != nil {
			return err
		}
		if err := st.Send(&testingv1.LookupResponse{Value: "v:" + r.GetKey()}); err != nil {
			return err
		}
		return grpcstatus.Error(codes.NotFound, "no more")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	st, err := c.Lookup(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.LookupRequest{Key: "a"}))
	<-ended
	// grpc-go may accept a send or two before it sees the stream's end.
	require.Eventually(t, func() bool { return st.Send(&testingv1.LookupRequest{Key: "b"}) == io.EOF },
		5*time.Second, time.Millisecond, "SendMsg reports the stream's end")
	got, err := st.Recv()
	require.NoError(t, err, "the message read ahead is handed over")
	require.Equal(t, "v:a", got.GetValue())
	_, err = st.Recv()
	require.Equal(t, codes.NotFound, grpcstatus.Code(err), "then the stream's status: %v", err)
	require.Equal(t, int64(1), svc.Calls("Lookup"), "a response message commits the stream: no repeat")
}

// A bidi stream of a NO_SIDE_EFFECTS method refused before any response is
// repeated, its requests replayed, without a query.
func TestNoSideEffectsBidiIsRepeatedBeforeAResponse(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{LookupFunc: func(st grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error {
		r, err := st.Recv()
		if err != nil {
			return err
		}
		if runs.Add(1) == 1 {
			return status.NotAdmitted(status.ReasonConcurrencyFull)
		}
		return st.Send(&testingv1.LookupResponse{Value: "v:" + r.GetKey()})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	st, err := c.Lookup(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.LookupRequest{Key: "a"}))
	got, err := st.Recv()
	require.NoError(t, err, "the refused try was repeated and its request replayed")
	require.Equal(t, "v:a", got.GetValue())
	require.NoError(t, st.CloseSend())
	_, err = st.Recv()
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, int32(2), runs.Load())
}

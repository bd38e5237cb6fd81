package interceptor_test

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// panicDecodeCodec is the proto codec, except that decoding a message of
// the response type (what the probe's scratch is made of) panics.
type panicDecodeCodec struct{}

func (panicDecodeCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (panicDecodeCodec) Unmarshal(data []byte, v any) error {
	if _, ok := v.(*testingv1.LookupResponse); ok {
		panic("a codec panics decoding a response")
	}
	return proto.Unmarshal(data, v.(proto.Message))
}
func (panicDecodeCodec) Name() string { return "proto" }

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// clientStream.SendMsg, on io.EOF from a stream that may still be
// repeated, decodes the try's next response itself (probeLocked, under
// cs.mu, with no panic guard). A panic below the interceptor there (a
// codec) goes up through SendMsg, but unlike the same panic in RecvMsg
// (recvUnlocked → panickedLocked: "ends the stream when a panic below the
// interceptor passes through one of its methods") it leaves the stream as
// it was: the try unsettled (its grant reserved), the span open, OnFinish
// not run.
func TestRegression15StreamOwnerProbePanicEndsStream(t *testing.T) {
	ended := make(chan struct{})
	svc := &testsvc.Service{LookupFunc: func(st grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error {
		defer close(ended)
		return st.Send(&testingv1.LookupResponse{Value: "v"})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(panicDecodeCodec{})))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
	require.NoError(t, err)
	finished := make(chan error, 1)
	st, err := client.Lookup(ctx, grpc.OnFinish(func(err error) { finished <- err }))
	require.NoError(t, err)
	<-ended
	time.Sleep(100 * time.Millisecond) // the response and status arrive
	var sendErr error
	func() {
		defer func() { require.NotNil(t, recover(), "precondition: the codec's panic reaches SendMsg's caller") }()
		sendErr = st.Send(&testingv1.LookupRequest{Key: "k"})
	}()
	require.NotEqual(t, io.EOF, sendErr)
	select {
	case <-finished:
	case <-time.After(3 * time.Second):
		t.Fatal("the stream a panic below the interceptor passed through did not end (OnFinish never ran)")
	}
}

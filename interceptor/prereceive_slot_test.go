package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A recorded server-streaming call's request is received before admission,
// as a unary request is decoded before it: a client that opens the stream
// and sends nothing holds no admission slot (it held one for as long as it
// liked, so a peer could pin every slot), and a request that comes after
// the attempt's deadline is answered by the store alone, taking no slot.
func TestServerStreamWaitingForItsRequestHoldsNoSlot(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	running := func() int { cs, _ := ctrl.Stats().Class("work"); return cs.Running }
	c := newConsumer()
	end := startRecorded(t, c, memoryStore(t), []interceptor.ServerOption{
		interceptor.WithAdmission(ctrl), interceptor.WithMaxAttemptTime(300 * time.Millisecond)})
	conn := end.DialT(t)
	client := testingv1.NewTestServiceClient(conn)

	// Opened without a deadline or a tollgate header (the server is the
	// origin and sets d), and no request sent yet.
	idle, err := conn.NewStream(t.Context(), &testingv1.TestService_ServiceDesc.Streams[3], consumeMethod)
	require.NoError(t, err)
	require.Zero(t, running(), "a stream waiting for its request holds no slot")

	// The one slot serves another call meanwhile.
	st, err := client.Consume(t.Context(), &testingv1.ConsumeRequest{Key: "k", Count: 2})
	require.NoError(t, err)
	got, err := recvConsumed(st)
	require.NoError(t, err)
	require.Equal(t, []string{"0", "1"}, got)
	require.Equal(t, int64(1), c.runs.Load())

	// The idle stream's request would come after the server's 300 ms
	// maximum (plus the skew): the admission tap bounds the stream by the
	// attempt's deadline, so grpc-go has ended it DEADLINE_EXCEEDED by then;
	// nothing ran.
	time.Sleep(400 * time.Millisecond)
	_ = idle.SendMsg(&testingv1.ConsumeRequest{Key: "k", Count: 1}) // io.EOF once the server ended the stream
	_ = idle.CloseSend()
	err = idle.RecvMsg(new(testingv1.ConsumeResponse))
	require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err), "%v", err)
	require.Equal(t, int64(1), c.runs.Load(), "the late request ran nothing")
	require.Zero(t, running())
}

// The same holds for a server-streaming call that keeps no record: on a
// server without a store, and for a method declared NO_SIDE_EFFECTS on one
// with a store. Before, such a stream took its slot first and its handler
// then waited for the request, which grpc-go's RecvMsg does for as long as
// the client keeps the stream open.
func TestUnrecordedServerStreamWaitingForItsRequestHoldsNoSlot(t *testing.T) {
	for _, tc := range []struct {
		name   string
		store  bool
		stream int // index in TestService_ServiceDesc.Streams
		method string
	}{
		{"no store", false, 3, consumeMethod},
		{"NO_SIDE_EFFECTS with a store", true, 0, testingv1.TestService_Watch_FullMethodName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ctrl.Close() })
			running := func() int { cs, _ := ctrl.Stats().Class("work"); return cs.Running }
			c := newConsumer()
			extra := []interceptor.ServerOption{interceptor.WithAdmission(ctrl)}
			var end *testsvc.Endpoint
			if tc.store {
				end = startRecorded(t, c, memoryStore(t), extra)
			} else {
				end = testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, c) }, serverOpts(extra...)...)
			}
			conn := end.DialT(t)
			idle, err := conn.NewStream(t.Context(), &testingv1.TestService_ServiceDesc.Streams[tc.stream], tc.method)
			require.NoError(t, err)
			// Time for the server to take up the stream (it did so at
			// once, taking the slot, before the change).
			time.Sleep(300 * time.Millisecond)
			require.Zero(t, running(), "a stream waiting for its request holds no slot")
			st, err := testingv1.NewTestServiceClient(conn).Consume(t.Context(), &testingv1.ConsumeRequest{Key: "k", Count: 1})
			require.NoError(t, err)
			got, err := recvConsumed(st)
			require.NoError(t, err, "the one slot serves another call meanwhile")
			require.Equal(t, []string{"0"}, got)
			require.NoError(t, idle.CloseSend())
			require.Error(t, idle.RecvMsg(new(testingv1.ConsumeResponse)), "a stream closed without its request ends with an error")
		})
	}
}

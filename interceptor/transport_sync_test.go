package interceptor_test

import (
	"testing"
	"time"

	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// transportCaughtUp returns once conn's client transport has handled every
// frame its server had queued before a call sent now: the call, to a
// method no server registers, is answered UNIMPLEMENTED on the same
// connection, after those frames (the server's writer sends a stream's
// queued messages ahead of a later call's answer), and the transport's one
// reader handles frames in order. So when it returns, the messages that
// came earlier wait in their stream's buffer and a stream whose status
// came earlier is closed: grpc-go raises InTrailer (trailerSeen) before it
// closes the stream, so a trailerSeen alone does not say SendMsg sees
// io.EOF yet.
func transportCaughtUp(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	err := conn.Invoke(t.Context(), "/tollgate.testing.v1.TestService/CaughtUp", &testingv1.GetRequest{}, &testingv1.GetResponse{})
	if c := grpcstatus.Code(err); c != codes.Unimplemented {
		t.Fatalf("precondition: the server answers the barrier call UNIMPLEMENTED, got %v", err)
	}
}

// ended waits for a stream's OnFinish report on finished: the stream has
// ended (grpc-go's, or tollgate's released or ended it), failing the test
// (a precondition) if it does not within 10 s.
func ended(t *testing.T, finished <-chan error) {
	t.Helper()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("precondition: the stream never ended (OnFinish never ran)")
	}
}

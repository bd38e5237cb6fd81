package interceptor_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// d3b4fb8: readStatusLocked stores the message it reads in cs.pending
// without looking whether a message read ahead earlier (probeLocked, on a
// SendMsg that returned io.EOF) is still waiting there. A NO_SIDE_EFFECTS
// bidi stream (a header does not commit it) whose server sent two messages
// and a status: the caller's Send sees io.EOF (the probe keeps message 1),
// then a Send over grpc-go's send limit reads message 2 into cs.pending,
// overwriting message 1. The caller's Recv returns message 2 first:
// message 1 is lost, out of order. Before d3b4fb8 the caller got message 1
// and then the stream's NOT_FOUND.
func TestRegression15StreamPendingOverwrite(t *testing.T) {
	ended := make(chan struct{})
	svc := &testsvc.Service{LookupFunc: func(st grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error {
		defer close(ended)
		r, err := st.Recv()
		if err != nil {
			return err
		}
		for _, p := range []string{"v1:", "v2:"} {
			if err := st.Send(&testingv1.LookupResponse{Value: p + r.GetKey()}); err != nil {
				return err
			}
		}
		return grpcstatus.Error(codes.NotFound, "no more")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	seen := trailerSeen{ch: make(chan struct{}, 1)}
	opts := append(interceptor.DialOptions(), grpc.WithStatsHandler(seen),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1024)))
	c := testingv1.NewTestServiceClient(end.DialT(t, opts...))
	st, err := c.Lookup(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.LookupRequest{Key: "a"}))
	<-ended
	select {
	case <-seen.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("precondition: the server's status never arrived")
	}
	require.Eventually(t, func() bool { return st.Send(&testingv1.LookupRequest{Key: "b"}) == io.EOF },
		5*time.Second, time.Millisecond, "precondition: SendMsg reports the stream's end (message 1 read ahead)")
	serr := st.Send(&testingv1.LookupRequest{Key: strings.Repeat("x", 4096)})
	require.Error(t, serr, "a send over the limit fails")
	var got []string
	var rerr error
	for {
		m, err := st.Recv()
		if err != nil {
			rerr = err
			break
		}
		got = append(got, m.GetValue())
	}
	t.Logf("Send: %v; Recv: %v, then %v", serr, got, rerr)
	require.NotEmpty(t, got)
	require.Equal(t, "v1:a", got[0], "the message read ahead was overwritten: the caller's first message is not the server's first")
}

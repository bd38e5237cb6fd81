package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// trailerSeen is a stats handler that signals when a client stream's
// trailer (the server's status) arrived.
type trailerSeen struct{ ch chan struct{} }

func (h trailerSeen) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h trailerSeen) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InTrailer); ok {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
}
func (h trailerSeen) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (h trailerSeen) HandleConn(context.Context, stats.ConnStats)                       {}

// A review found that a server stream that completed (all messages and the OK status arrived,
// unread) before the caller's ClientConn closed: grpc-go still hands the
// caller every message and io.EOF, since the transport stream had ended
// before the close. tryFinished takes grpc-go's OnFinish(ErrClientConnClosing)
// for a stream cut off and ends tollgate's stream UNKNOWN at once: the
// buffered messages and the success are lost.
func TestRegression14cClientStreamCompletedBeforeConnCloseKeepsItsMessages(t *testing.T) {
	for _, tollgate := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain grpc-go", true: "tollgate"}[tollgate], func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			conn, st, finished := completedUnreadWatch(t, ctx, tollgate)
			require.NoError(t, conn.Close())
			select {
			case err := <-finished:
				t.Logf("OnFinish ran with %v", err)
			case <-time.After(300 * time.Millisecond):
				t.Log("OnFinish did not run after the close (tollgate's runs once the caller read the stream's end)")
			}
			got, err := recvAll(st)
			require.NoError(t, err, "a stream that had ended OK before the close")
			require.Equal(t, []string{"0", "1", "2"}, got)
		})
	}
}

// completedUnreadWatch opens a Watch on ctx (through tollgate's dial
// options, with tollgate) whose server sends three messages and OK, and
// waits until all of it arrived, unread. It returns the connection, the
// stream and the channel of the caller's OnFinish.
func completedUnreadWatch(t *testing.T, ctx context.Context, tollgate bool) (*grpc.ClientConn, grpc.ServerStreamingClient[testingv1.WatchResponse], chan error) {
	t.Helper()
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		return sendWatch(ss, 3)
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	seen := trailerSeen{ch: make(chan struct{}, 1)}
	dial := []grpc.DialOption{grpc.WithStatsHandler(seen)}
	if tollgate {
		dial = append(interceptor.DialOptions(fastRetry(3), interceptor.WithAttemptTimeout(time.Minute)), dial...)
	}
	conn, err := end.Dial(dial...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	finished := make(chan error, 1)
	st, err := testingv1.NewTestServiceClient(conn).Watch(ctx, &testingv1.WatchRequest{Key: "k"},
		grpc.OnFinish(func(err error) { finished <- err }))
	require.NoError(t, err)
	select {
	case <-seen.ch: // the whole stream arrived, unread
	case <-time.After(10 * time.Second):
		t.Fatal("precondition: the server's status never arrived")
	}
	return conn, st, finished
}

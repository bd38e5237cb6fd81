package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// endSeen signals when a client attempt's stream ended in grpc-go (stats.End).
type endSeen struct{ ch chan struct{} }

func (h endSeen) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h endSeen) HandleRPC(_ context.Context, s stats.RPCStats) {
	if e, ok := s.(*stats.End); ok && e.Client {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
}
func (h endSeen) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (h endSeen) HandleConn(context.Context, stats.ConnStats)                       {}

// A review found that a stream whose status had arrived, unread, when its
// caller released it by closing the ClientConn (grpc-go's way 1: its
// OnFinish then runs) was never ended: the close handling leaves such a try
// to the caller's reads, which never come, so the caller's OnFinish never
// ran and the tollgate.call span never ended. The stream's context now ends
// with the attempt, so such a stream ends at the attempt's deadline at the
// latest (here 2 s); plain grpc-go runs OnFinish at the close itself.
func TestRegression14dCloseFixStreamWithArrivedStatusIsReleasedByConnClose(t *testing.T) {
	for _, tollgate := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain grpc-go", true: "tollgate"}[tollgate], func(t *testing.T) {
			svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
				return sendWatch(ss, 2)
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			seen := trailerSeen{ch: make(chan struct{}, 1)}
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			dial := []grpc.DialOption{grpc.WithStatsHandler(seen)}
			if tollgate {
				dial = append(interceptor.DialOptions(fastRetry(3), interceptor.WithAttemptTimeout(2*time.Second),
					interceptor.WithClientTracerProvider(tp)), dial...)
			}
			conn, err := end.Dial(dial...)
			require.NoError(t, err)
			client := testingv1.NewTestServiceClient(conn)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			finished := make(chan error, 1)
			_, err = client.Watch(ctx, &testingv1.WatchRequest{Key: "k"}, grpc.OnFinish(func(err error) { finished <- err }))
			require.NoError(t, err)
			select {
			case <-seen.ch: // the stream's status arrived; the caller reads nothing
			case <-time.After(10 * time.Second):
				t.Fatal("precondition: the server's status never arrived")
			}
			require.NoError(t, conn.Close()) // grpc-go's way 1 to release a stream
			select {
			case err := <-finished:
				t.Logf("OnFinish ran with %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("OnFinish never ran after the ClientConn closed under a stream whose status had arrived")
			}
			if tollgate {
				require.Len(t, spans.Ended(), 1, "the tollgate.call span ended")
			}
		})
	}
}

// A review found that when a try's grpc-go stream was cut at the attempt's
// deadline (WithAttemptTimeout, a caller's context without a deadline),
// grpc-go ran the try's OnFinish then, tryFinished ignored it (the conn was
// not shut down), and nothing ended tollgate's stream; when the caller then
// released it by closing the ClientConn, grpc-go ran no OnFinish again: the
// stream was never ended. Its context now ends with the attempt.
func TestRegression14dCloseFixStreamCutAtAttemptDeadlineIsReleasedByConnClose(t *testing.T) {
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		if err := ss.Send(&testingv1.WatchResponse{}); err != nil {
			return err
		}
		<-ss.Context().Done()
		return ss.Context().Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	ended := endSeen{ch: make(chan struct{}, 1)}
	dial := append(interceptor.DialOptions(fastRetry(3), interceptor.WithAttemptTimeout(time.Second)),
		grpc.WithStatsHandler(ended))
	conn, err := end.Dial(dial...)
	require.NoError(t, err)
	client := testingv1.NewTestServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background()) // no deadline of its own
	defer cancel()
	finished := make(chan error, 1)
	st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "k"}, grpc.OnFinish(func(err error) { finished <- err }))
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	select {
	case <-ended.ch: // grpc-go ended the try at the attempt's deadline
	case <-time.After(20 * time.Second):
		t.Fatal("precondition: the try never ended")
	}
	require.NoError(t, conn.Close())
	select {
	case err := <-finished:
		t.Logf("OnFinish ran with %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("OnFinish never ran: neither the attempt's deadline nor the ClientConn's close ended the stream")
	}
}

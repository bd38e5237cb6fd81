package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// Until this change, a stream whose status had arrived, unread, when its
// caller closed the ClientConn kept its span, its grant and the caller's
// OnFinish open until the caller's context ended, which for a context
// without a deadline is never; grpc-go runs OnFinish at the close. It is now
// released at the close: its bookkeeping ends, and the caller's reads still
// drain its messages and its status.
func TestRegression15StreamCompletedUnreadIsReleasedAtConnClose(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, st, finished := completedUnreadWatch(t, ctx, true)
	require.NoError(t, conn.Close())
	select {
	case err := <-finished:
		require.Equal(t, codes.Canceled, grpcstatus.Code(err), "OnFinish runs with the close, as grpc-go's: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("OnFinish did not run when the ClientConn closed under a stream nothing read")
	}
	got, err := recvAll(st)
	require.NoError(t, err, "the stream had ended OK before the close")
	require.Equal(t, []string{"0", "1", "2"}, got)
	select {
	case err := <-finished:
		t.Fatalf("OnFinish ran twice (again with %v)", err)
	default:
	}
}

// unreadWatch opens a Watch, with a caller's context that has no deadline,
// under an attempt of timeout, on a server whose handler sends two messages
// and then, when complete is set, ends OK, else waits for its context. It
// returns the stream, the caller's OnFinish channel and the span exporter.
func unreadWatch(t *testing.T, timeout time.Duration, complete bool) (grpc.ServerStreamingClient[testingv1.WatchResponse], chan error, *tracetest.InMemoryExporter) {
	t.Helper()
	arrived := make(chan struct{})
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		if err := sendWatch(ss, 2); err != nil {
			return err
		}
		if complete {
			return nil
		}
		<-ss.Context().Done()
		return ss.Context().Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	seen := trailerSeen{ch: make(chan struct{}, 1)}
	conn := end.DialT(t, append(interceptor.DialOptions(fastRetry(3), interceptor.WithAttemptTimeout(timeout),
		interceptor.WithClientTracerProvider(tp)), grpc.WithStatsHandler(seen))...)
	ctx, cancel := context.WithCancel(context.Background()) // no deadline of the caller's own
	t.Cleanup(cancel)
	finished := make(chan error, 2)
	st, err := testingv1.NewTestServiceClient(conn).Watch(ctx, &testingv1.WatchRequest{Key: "k"},
		grpc.OnFinish(func(err error) { finished <- err }))
	require.NoError(t, err)
	if complete {
		go func() {
			<-seen.ch
			close(arrived)
		}()
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("precondition: the server's status never arrived")
		}
	}
	return st, finished, spans
}

// Until this change, a stream cut at its attempt's deadline while its
// caller's context had no deadline and nothing read it kept its span, its
// grant and the caller's OnFinish open until that context ended (never, for
// one without a deadline); grpc-go ends a stream at its context's deadline
// whether or not anything reads it. The stream is now ended at the try's
// deadline as a read would have ended it — its outcome decided and
// resolved — while the caller's reads still get the messages that arrived
// before the cut, then that outcome.
func TestRegression15StreamCutAtAttemptDeadlineUnreadIsEnded(t *testing.T) {
	st, finished, spans := unreadWatch(t, 400*time.Millisecond, false)
	var fin error
	select {
	case fin = <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("OnFinish did not run at the attempt's deadline of a stream nothing read")
	}
	require.Error(t, fin)
	require.Len(t, spans.GetSpans(), 1, "the stream's tollgate.call span ended with it")
	got, err := recvAll(st)
	require.Equal(t, []string{"0", "1"}, got, "the messages that arrived before the cut are still the caller's")
	require.Error(t, err)
	require.Equal(t, status.OutcomeOf(fin).Kind, status.OutcomeOf(err).Kind, "reads end as OnFinish said: %v vs %v", err, fin)
	require.Equal(t, grpcstatus.Code(fin), grpcstatus.Code(err), "%v vs %v", err, fin)
	require.Len(t, finished, 0, "OnFinish ran once")
}

// The same stream, completed OK (every message and the status arrived)
// before the attempt's deadline, unread: it is released at the deadline
// (bookkeeping ended, OnFinish run) and its reads still drain the messages
// and the success.
func TestRegression15StreamCompletedUnreadIsReleasedAtAttemptDeadline(t *testing.T) {
	st, finished, spans := unreadWatch(t, 400*time.Millisecond, true)
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("OnFinish did not run at the attempt's deadline of a stream nothing read")
	}
	require.Len(t, spans.GetSpans(), 1, "the stream's tollgate.call span ended")
	got, err := recvAll(st)
	require.NoError(t, err, "the stream had ended OK before the deadline")
	require.Equal(t, []string{"0", "1"}, got)
	require.Len(t, finished, 0, "OnFinish ran once")
}

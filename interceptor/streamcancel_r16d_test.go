package interceptor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// A review found the defect this test guards against.
//
// receiveFirst waits for a server-streaming call's request on a goroutine
// when grpc-go's RecvMsg may not watch the stream's context; when that
// context is canceled and ends as the transport stream's Context() does
// (streamContext), it kept waiting for the receive, taking the
// cancellation for the client's going away, which ends the receive at
// once. But grpc-go v1.85 gives the transport stream the context its stats
// handler's TagRPC returned (SetContext), after its reader was set up on
// the transport's own: a TagRPC context canceled by its stats handler
// (shedding, draining) passes streamContext while RecvMsg does not watch
// it, and a client that opened the stream and sent nothing held it, and the
// goroutine serving it, for as long as it kept the stream open (with the
// admission tap, until the tap's bound). With the tap, whose bound the
// reader watches, such a wait is refused at once as one whose context
// ended before its request came, as the package doc says; without it,
// where nothing tells that cancellation from the client's going away, it
// is waited out no longer than the handler would run (the attempt's
// deadline plus the skew), and refused then.
func TestR16dStreamRequestWaitHonoursAStatsHandlersCancellation(t *testing.T) {
	for _, tap := range []bool{false, true} {
		t.Run(fmt.Sprintf("tap=%v", tap), func(t *testing.T) { r16dStatsHandlerCancel(t, tap) })
	}
}

func r16dStatsHandlerCancel(t *testing.T, tap bool) {
	sh := &r16dCancelTagger{tagged: make(chan struct{}, 1)}
	conn, c, store := r16StatsHandlerServer(t, tap, sh)
	leaks := goleak.IgnoreCurrent()

	// A trusted peer's attempt a minute long (without the tap, 300 ms);
	// the client sends no grpc-timeout and no request, and does not cancel.
	d := time.Minute
	if !tap {
		d = 300 * time.Millisecond
	}
	id, _ := uuid.NewV7()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
		fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, time.Now().Add(d).UnixMilli()))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
	require.NoError(t, err)
	ended := make(chan error, 1)
	go func() { ended <- s.RecvMsg(new(testingv1.ConsumeResponse)) }()
	<-sh.tagged
	sh.cancelAll() // the stats handler cancels the RPC's context
	select {
	case err = <-ended:
	case <-time.After(10 * time.Second): // a guard against the hang, not a timing assertion
		cancel()
		<-ended
		t.Fatal("the server kept waiting for the request after its stats handler canceled the RPC's context")
	}
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Zero(t, c.runs.Load(), "nothing ran")
	require.Zero(t, store.Len(), "nothing was begun")
	cancel()
	require.NoError(t, goleak.Find(r16dIgnoreConn(leaks)...), "the receive's goroutine ends with the stream")
}

// r16dCancelTagger is a server stats handler whose TagRPC gives each RPC a
// cancellation of its own, which cancelAll (or the RPC's end) calls.
type r16dCancelTagger struct {
	tagged  chan struct{}
	mu      sync.Mutex
	cancels []context.CancelFunc
}

func (h *r16dCancelTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	h.mu.Lock()
	h.cancels = append(h.cancels, cancel)
	h.mu.Unlock()
	select {
	case h.tagged <- struct{}{}:
	default:
	}
	return ctx
}

func (h *r16dCancelTagger) cancelAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, cancel := range h.cancels {
		cancel()
	}
	h.cancels = nil
}

func (*r16dCancelTagger) HandleRPC(context.Context, stats.RPCStats) {}

func (*r16dCancelTagger) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (*r16dCancelTagger) HandleConn(context.Context, stats.ConnStats) {}

// r16dIgnoreConn is leaks, the goroutine snapshot, with the server
// connection's own goroutines ignored: grpc-go starts them as it accepts
// the connection, possibly after the client saw it ready and the test took
// its snapshot; they live as long as the connection, not the stream, and
// made the check that the receive's goroutine ends with the stream flaky.
func r16dIgnoreConn(leaks goleak.Option) []goleak.Option {
	return []goleak.Option{leaks,
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*http2Server).HandleStreams"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*http2Server).keepalive"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*loopyWriter).run")}
}

package grpcfacts_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// trailerRecorder keeps, per call (a *factsCall in the call's context), the
// method TagRPC saw, the events in order and InTrailer's Trailer.
type trailerRecorder struct{}

type factsCallKey struct{}

type factsCall struct {
	mu      sync.Mutex
	tagged  string
	events  []string
	trailer metadata.MD
}

func (trailerRecorder) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if c, _ := ctx.Value(factsCallKey{}).(*factsCall); c != nil {
		c.mu.Lock()
		c.tagged = info.FullMethodName
		c.events = append(c.events, "TagRPC")
		c.mu.Unlock()
	}
	return ctx
}
func (trailerRecorder) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (trailerRecorder) HandleConn(context.Context, stats.ConnStats)                       {}
func (trailerRecorder) HandleRPC(ctx context.Context, s stats.RPCStats) {
	c, _ := ctx.Value(factsCallKey{}).(*factsCall)
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch s := s.(type) {
	case *stats.OutHeader:
		c.events = append(c.events, "OutHeader")
	case *stats.InHeader:
		c.events = append(c.events, "InHeader")
	case *stats.InTrailer:
		c.events = append(c.events, "InTrailer")
		c.trailer = s.Trailer
	case *stats.End:
		c.events = append(c.events, "End")
	}
}

// The stats InTrailer event carries the server's trailer keys (read by
// index, lower case) both on a trailers-only answer (an interceptor's
// refusal before any header) and after a header, and it is delivered before
// Invoke returns, after TagRPC (which names the invoked method) and
// OutHeader. tollgate's stats handler reads tollgate-spent and
// grpc-retry-pushback-ms from it, not from grpc.Trailer.
func TestInTrailerCarriesTrailerKeys(t *testing.T) {
	for _, headerFirst := range []bool{false, true} {
		icpt := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if headerFirst {
				require.NoError(t, grpc.SendHeader(ctx, metadata.Pairs("x", "1")))
			}
			_ = grpc.SetTrailer(ctx, metadata.Pairs("tollgate-spent", "2", "grpc-retry-pushback-ms", "7"))
			return nil, grpcstatus.Error(codes.ResourceExhausted, "full")
		}
		conn, _ := factsServe(t, ok, []grpc.ServerOption{grpc.UnaryInterceptor(icpt)}, grpc.WithStatsHandler(trailerRecorder{}), grpc.WithDisableRetry())
		c := &factsCall{}
		err := factsInvoke(context.WithValue(t.Context(), factsCallKey{}, c), conn)
		require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(err))
		c.mu.Lock()
		require.Equal(t, "/facts.Svc/Call", c.tagged)
		require.Equal(t, []string{"2"}, c.trailer["tollgate-spent"], "headerFirst=%v", headerFirst)
		require.Equal(t, []string{"7"}, c.trailer["grpc-retry-pushback-ms"], "headerFirst=%v", headerFirst)
		want := []string{"TagRPC", "OutHeader", "InTrailer"}
		if headerFirst {
			want = []string{"TagRPC", "OutHeader", "InHeader", "InTrailer"}
		}
		require.Equal(t, want, c.events[:len(want)], "headerFirst=%v", headerFirst)
		c.mu.Unlock()
	}
}

// MaxConcurrentStreams (set by interceptor.ServerOptions to make admission's
// byte bounds real) limits the streams a client opens on one connection: a
// call beyond the limit waits on the client for a stream, its handler never
// runs, and — what NOT_SENT rests on — it fires no OutHeader while it waits.
func TestMaxConcurrentStreamsHoldsCallsOnTheClient(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	block := func(ctx context.Context) (*emptypb.Empty, error) {
		entered <- struct{}{}
		<-release
		return &emptypb.Empty{}, nil
	}
	conn, n := factsServe(t, block, []grpc.ServerOption{grpc.MaxConcurrentStreams(1)}, grpc.WithStatsHandler(trailerRecorder{}), grpc.WithDisableRetry())
	first := make(chan error, 1)
	go func() { first <- factsInvoke(t.Context(), conn) }()
	<-entered
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond) // only ends the waiting call
	defer cancel()
	c := &factsCall{}
	err := factsInvoke(context.WithValue(ctx, factsCallKey{}, c), conn)
	close(release)
	require.NoError(t, <-first)
	require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err))
	require.Equal(t, int64(1), n.Load(), "the call beyond the limit never reached a handler")
	c.mu.Lock()
	defer c.mu.Unlock()
	require.NotContains(t, c.events, "OutHeader", "waiting for a stream is not sending")
}

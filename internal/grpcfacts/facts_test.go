package grpcfacts_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type ctxKey struct{}

// recorder is a client stats handler that records, per call, the events it
// saw, found through a value the client interceptor put in the call's context.
type recorder struct{}

type seen struct {
	mu     sync.Mutex
	events []string
}

func (recorder) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (recorder) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (recorder) HandleConn(context.Context, stats.ConnStats) {}
func (recorder) HandleRPC(ctx context.Context, s stats.RPCStats) {
	rec, _ := ctx.Value(ctxKey{}).(*seen)
	if rec == nil {
		return
	}
	var name string
	switch s.(type) {
	case *stats.OutHeader:
		name = "OutHeader"
	case *stats.InTrailer:
		name = "InTrailer"
	case *stats.InHeader:
		name = "InHeader"
	default:
		return
	}
	rec.mu.Lock()
	rec.events = append(rec.events, name)
	rec.mu.Unlock()
}

var desc = grpc.ServiceDesc{
	ServiceName: "facts.Svc",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Call",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) {
				return srv.(func(context.Context) (*emptypb.Empty, error))(ctx)
			}
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/facts.Svc/Call"}, h)
		},
	}},
}

func serve(t *testing.T, handler func(context.Context) (*emptypb.Empty, error), opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&desc, handler)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(recorder{}),
		grpc.WithDisableRetry(),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); srv.Stop() })
	return conn
}

func call(ctx context.Context, conn *grpc.ClientConn, rec *seen, opts ...grpc.CallOption) error {
	return conn.Invoke(context.WithValue(ctx, ctxKey{}, rec), "/facts.Svc/Call", &emptypb.Empty{}, &emptypb.Empty{}, opts...)
}

// A value the client puts in the call's context reaches the stats handler's
// HandleRPC for that call, so a client interceptor can learn its own call's
// OutHeader and InTrailer.
func TestClientStatsSeeCallContext(t *testing.T) {
	conn := serve(t, func(context.Context) (*emptypb.Empty, error) { return &emptypb.Empty{}, nil })
	rec := &seen{}
	require.NoError(t, call(t.Context(), conn, rec))
	require.Contains(t, rec.events, "OutHeader")
	require.Contains(t, rec.events, "InTrailer")
}

// A refusal from a tap handle (trailers-only, before any handler) still
// delivers InTrailer to the client: the peer's status arrived.
func TestTapRefusalDeliversInTrailer(t *testing.T) {
	refuse := func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		return ctx, grpcstatus.Error(codes.ResourceExhausted, "full")
	}
	conn := serve(t, func(context.Context) (*emptypb.Empty, error) { return &emptypb.Empty{}, nil }, grpc.InTapHandle(refuse))
	rec := &seen{}
	err := call(t.Context(), conn, rec)
	require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(err))
	require.Contains(t, rec.events, "OutHeader")
	require.Contains(t, rec.events, "InTrailer")
}

// A call whose context is already cancelled never queues its headers: no
// OutHeader, so the client can call it NOT_SENT.
func TestCancelledCallHasNoOutHeader(t *testing.T) {
	conn := serve(t, func(context.Context) (*emptypb.Empty, error) { return &emptypb.Empty{}, nil })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rec := &seen{}
	err := call(ctx, conn, rec)
	require.Equal(t, codes.Canceled, grpcstatus.Code(err))
	require.NotContains(t, rec.events, "OutHeader")
}

// A client-side deadline that ends while the handler runs leaves the call
// without InTrailer: the peer's status never arrived (CALL_LOST territory).
func TestClientDeadlineHasNoInTrailer(t *testing.T) {
	release := make(chan struct{})
	conn := serve(t, func(ctx context.Context) (*emptypb.Empty, error) {
		<-release
		return &emptypb.Empty{}, nil
	})
	ctx, cancel := context.WithCancel(t.Context())
	rec := &seen{}
	done := make(chan error, 1)
	go func() { done <- call(ctx, conn, rec) }()
	// Wait until the request is on its way, then give up waiting for it.
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.events) > 0
	}, testTimeout, tick)
	cancel()
	err := <-done
	close(release)
	require.Equal(t, codes.Canceled, grpcstatus.Code(err))
	require.Contains(t, rec.events, "OutHeader")
	require.NotContains(t, rec.events, "InTrailer")
}

// A server stream interceptor may set trailers after the handler returned,
// and a unary interceptor may set them on the error path; the client reads
// both with grpc.Trailer.
func TestTrailerSetAfterHandlerError(t *testing.T) {
	icpt := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		_ = grpc.SetTrailer(ctx, metadata.Pairs("tollgate-spent", "3"))
		return resp, err
	}
	conn := serve(t, func(context.Context) (*emptypb.Empty, error) {
		return nil, grpcstatus.Error(codes.NotFound, "no")
	}, grpc.UnaryInterceptor(icpt))
	var md metadata.MD
	err := call(t.Context(), conn, &seen{}, grpc.Trailer(&md))
	require.Equal(t, codes.NotFound, grpcstatus.Code(err))
	require.Equal(t, []string{"3"}, md.Get("tollgate-spent"))
}

// The keys of the trailer a client receives are lower case (HTTP/2 header
// names are lower case on the wire), so a client may index the trailer map
// with a lower-case key instead of MD.Get, which lowers the key on every
// call. A trailer a server names in upper case never arrives under that key:
// the client's framer refuses the name, and the call ends INTERNAL.
func TestTrailerKeysArriveLowerCase(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trailer metadata.MD
		code    codes.Code
	}{
		{"lower case", metadata.MD{"tollgate-spent": {"3"}}, codes.OK},
		{"upper case", metadata.MD{"Tollgate-Spent": {"3"}}, codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			icpt := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				resp, err := h(ctx, req)
				_ = grpc.SetTrailer(ctx, tc.trailer)
				return resp, err
			}
			conn := serve(t, func(context.Context) (*emptypb.Empty, error) { return &emptypb.Empty{}, nil }, grpc.UnaryInterceptor(icpt))
			var md metadata.MD
			err := call(t.Context(), conn, &seen{}, grpc.Trailer(&md))
			require.Equal(t, tc.code, grpcstatus.Code(err), "%v", err)
			for k := range md {
				require.Equal(t, strings.ToLower(k), k, "trailer key %q", k)
			}
			if tc.code == codes.OK {
				require.Equal(t, []string{"3"}, md["tollgate-spent"])
			}
		})
	}
}

// The context a tap handle receives carries the peer (its address and auth
// info), so a tap can ask whether the peer is trusted.
func TestTapContextCarriesPeer(t *testing.T) {
	var (
		mu   sync.Mutex
		addr net.Addr
	)
	look := func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		p, ok := peer.FromContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		if ok {
			addr = p.Addr
		}
		return ctx, nil
	}
	conn := serve(t, func(context.Context) (*emptypb.Empty, error) { return &emptypb.Empty{}, nil }, grpc.InTapHandle(look))
	require.NoError(t, call(t.Context(), conn, &seen{}))
	mu.Lock()
	defer mu.Unlock()
	require.NotNil(t, addr, "the tap's context has the peer")
}

// A context a tap handle returns becomes the stream's context: a deadline
// the tap sets ends the stream's RecvMsg (and the handler's context) even
// when the client sent no grpc-timeout, so a tap can bound a stream whose
// client never sends. grpc-go then ends the stream itself: the client gets
// DEADLINE_EXCEEDED, whatever status the handler returns after.
func TestTapContextBoundsStreamRecv(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	bound := func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		// cancel is not called: the context is released when its parent,
		// the stream's context, ends with the stream.
		ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_ = cancel
		return ctx, nil
	}
	recvErr := make(chan error, 1)
	srv := grpc.NewServer(grpc.InTapHandle(bound))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "facts.Streams",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Idle", ClientStreams: true, ServerStreams: true,
			Handler: func(_ any, st grpc.ServerStream) error {
				recvErr <- st.RecvMsg(new(emptypb.Empty))
				return grpcstatus.Error(codes.ResourceExhausted, "a status of the handler's")
			}}},
	}, struct{}{})
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); srv.Stop() })
	ctx, cancel := context.WithCancel(t.Context()) // no deadline: no grpc-timeout
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/facts.Streams/Idle")
	require.NoError(t, err)
	select {
	case err := <-recvErr:
		require.Error(t, err, "RecvMsg ended by the tap's deadline")
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's RecvMsg still waits: the tap's context does not bound the stream")
	}
	err = st.RecvMsg(new(emptypb.Empty))
	require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err), "%v", err)
}

// payloadRecorder is a client stats handler that keeps the payload of the
// OutPayload events it sees.
type payloadRecorder struct {
	recorder
	mu       sync.Mutex
	payloads []any
}

func (p *payloadRecorder) HandleRPC(_ context.Context, s stats.RPCStats) {
	if o, ok := s.(*stats.OutPayload); ok {
		p.mu.Lock()
		p.payloads = append(p.payloads, o.Payload)
		p.mu.Unlock()
	}
}

// A unary call's OutPayload event carries the very request message given to
// Invoke (not a copy), so a stats handler can tell a call that sends a given
// message from one that sends another.
func TestOutPayloadIsTheRequestMessage(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	srv.RegisterService(&desc, func(context.Context) (*emptypb.Empty, error) { return &emptypb.Empty{}, nil })
	go func() { _ = srv.Serve(lis) }()
	rec := &payloadRecorder{}
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(rec))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); srv.Stop() })
	req := &emptypb.Empty{}
	require.NoError(t, conn.Invoke(t.Context(), "/facts.Svc/Call", req, &emptypb.Empty{}))
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.payloads, 1)
	got, ok := rec.payloads[0].(*emptypb.Empty)
	require.True(t, ok)
	require.Same(t, req, got)
}

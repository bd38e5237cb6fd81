package grpcfacts_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"
)

// DESIGN §6: a stream interceptor can set trailers after the handler
// returned (with an error or without), and the client reads them with
// ClientStream.Trailer.
func TestStreamInterceptorTrailerAfterHandler(t *testing.T) {
	for _, herr := range []error{nil, grpcstatus.Error(codes.NotFound, "no")} {
		lis := bufconn.Listen(1 << 20)
		icpt := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			err := h(srv, ss)
			ss.SetTrailer(metadata.Pairs("tollgate-spent", "4"))
			return err
		}
		srv := grpc.NewServer(grpc.StreamInterceptor(icpt))
		srv.RegisterService(&grpc.ServiceDesc{
			ServiceName: "facts.Streams", HandlerType: (*any)(nil),
			Streams: []grpc.StreamDesc{{StreamName: "Down", ServerStreams: true,
				Handler: func(_ any, st grpc.ServerStream) error {
					if err := st.RecvMsg(new(emptypb.Empty)); err != nil {
						return err
					}
					if err := st.SendMsg(&emptypb.Empty{}); err != nil {
						return err
					}
					return herr
				}}},
		}, struct{}{})
		go func() { _ = srv.Serve(lis) }()
		conn, err := grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		st, err := conn.NewStream(t.Context(), &grpc.StreamDesc{ServerStreams: true}, "/facts.Streams/Down")
		require.NoError(t, err)
		require.NoError(t, st.SendMsg(&emptypb.Empty{}))
		require.NoError(t, st.CloseSend())
		require.NoError(t, st.RecvMsg(new(emptypb.Empty)))
		end := st.RecvMsg(new(emptypb.Empty))
		if herr == nil {
			require.ErrorIs(t, end, io.EOF)
		} else {
			require.Equal(t, grpcstatus.Code(herr), grpcstatus.Code(end), "%v", end)
		}
		require.Equal(t, []string{"4"}, st.Trailer().Get("tollgate-spent"), "handler error %v", herr)
		_ = conn.Close()
		srv.Stop()
	}
}

// DESIGN §6: a unary interceptor that recovers a handler's panic can still
// set the trailer on that path.
func TestTrailerOnRecoveredPanic(t *testing.T) {
	icpt := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				_ = grpc.SetTrailer(ctx, metadata.Pairs("tollgate-spent", "5"))
				err = grpcstatus.Error(codes.Internal, fmt.Sprint(r))
			}
		}()
		return h(ctx, req)
	}
	conn, _ := factsServe(t, func(context.Context) (*emptypb.Empty, error) { panic("boom") }, []grpc.ServerOption{grpc.UnaryInterceptor(icpt)})
	var md metadata.MD
	require.Equal(t, codes.Internal, grpcstatus.Code(factsInvoke(t.Context(), conn, grpc.Trailer(&md))))
	require.Equal(t, []string{"5"}, md.Get("tollgate-spent"))
}

// grpc.SetTrailer merges: the handler's trailer keys and the interceptor's
// arrive together, and the same key set twice arrives with both values in
// order (so a handler that copies a tollgate-spent trailer from below makes
// the interceptor's value a second one, which tollgate's client reads as
// malformed: it does not replace it).
func TestSetTrailerMerges(t *testing.T) {
	icpt := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		_ = grpc.SetTrailer(ctx, metadata.Pairs("tollgate-spent", "3"))
		return resp, err
	}
	handler := func(ctx context.Context) (*emptypb.Empty, error) {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-user", "u", "tollgate-spent", "9"))
		return &emptypb.Empty{}, nil
	}
	conn, _ := factsServe(t, handler, []grpc.ServerOption{grpc.UnaryInterceptor(icpt)})
	var md metadata.MD
	require.NoError(t, factsInvoke(t.Context(), conn, grpc.Trailer(&md)))
	require.Equal(t, []string{"u"}, md.Get("x-user"))
	require.Equal(t, []string{"9", "3"}, md.Get("tollgate-spent"))
}

// Interceptor order, which ServerOptions/DialOptions document ("chained, so
// they compose with the server's own in the order given"): on the server,
// UnaryInterceptor runs first, then the chained ones in the order of the
// options and of their arguments; the same on the client.
func TestInterceptorOrder(t *testing.T) {
	var (
		mu    sync.Mutex
		order []string
	)
	note := func(s string) {
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
	}
	si := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			note(name)
			return h(ctx, req)
		}
	}
	ci := func(name string) grpc.UnaryClientInterceptor {
		return func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			note(name)
			return inv(ctx, m, req, reply, cc, opts...)
		}
	}
	conn, _ := factsServe(t, ok,
		[]grpc.ServerOption{grpc.ChainUnaryInterceptor(si("s2"), si("s3")), grpc.UnaryInterceptor(si("s1")), grpc.ChainUnaryInterceptor(si("s4"))},
		grpc.WithChainUnaryInterceptor(ci("c2")), grpc.WithUnaryInterceptor(ci("c1")), grpc.WithChainUnaryInterceptor(ci("c3"), ci("c4")))
	require.NoError(t, factsInvoke(t.Context(), conn))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"c1", "c2", "c3", "c4", "s1", "s2", "s3", "s4"}, order)
}

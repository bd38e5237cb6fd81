package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// copyingTransport is the grpc.ServerTransportStream of BenchmarkOwnWork: it
// keeps a copy of the trailer it is given, as grpc-go's transport does.
type copyingTransport struct{ trailer metadata.MD }

func (f *copyingTransport) Method() string                  { return "/tollgate.testing.v1.TestService/Get" }
func (f *copyingTransport) SetHeader(md metadata.MD) error  { return nil }
func (f *copyingTransport) SendHeader(md metadata.MD) error { return nil }
func (f *copyingTransport) SetTrailer(md metadata.MD) error {
	f.trailer = metadata.Join(f.trailer, md)
	return nil
}

// BenchmarkOwnWork measures each side's interceptor work per call without a
// transport, side by side with the floor's (BenchmarkPropagation's unique
// floor + deadline + stats on the client, its trailer-setting interceptor on
// the server): the client interceptor with an invoker that only plays the
// stats events a real call delivers to the installed handler (OutHeader and
// an InTrailer carrying tollgate-spent), and the server interceptor with a
// handler that spends one unit, under a context carrying a tollgate header
// and a deadline as grpc-go's would. It shows where tollgate's own cost per
// call lies, which the round trips of BenchmarkPropagation blur with the
// transport's.
//
//	go test -run '^$' -bench OwnWork -benchmem -count 10 ./interceptor/
func BenchmarkOwnWork(b *testing.B) {
	const method = "/tollgate.testing.v1.TestService/Get"
	trailer := metadata.Pairs("tollgate-spent", "1")
	invokerWith := func(sh stats.Handler) grpc.UnaryInvoker {
		return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			ctx = sh.TagRPC(ctx, &stats.RPCTagInfo{FullMethodName: method})
			sh.HandleRPC(ctx, &stats.OutHeader{})
			sh.HandleRPC(ctx, &stats.InTrailer{Trailer: trailer})
			return nil
		}
	}
	b.Run("client/floor", func(b *testing.B) {
		inv := invokerWith(noopStats{})
		b.ReportAllocs()
		for b.Loop() {
			_ = uniqueFloorDeadlineClient(context.Background(), method, &testingv1.GetRequest{}, &testingv1.GetResponse{}, nil, inv)
		}
	})
	b.Run("client/tollgate", func(b *testing.B) {
		u, _, err := interceptor.NewClientInterceptors()
		if err != nil {
			b.Fatal(err)
		}
		inv := invokerWith(interceptor.StatsHandler())
		b.ReportAllocs()
		for b.Loop() {
			_ = u(context.Background(), method, &testingv1.GetRequest{}, &testingv1.GetResponse{}, nil, inv)
		}
	})
	info := &grpc.UnaryServerInfo{FullMethod: method}
	spend := func(ctx context.Context, _ any) (any, error) {
		if a, ok := budget.FromContext(ctx); ok {
			_ = a.Take()
		}
		return &testingv1.GetResponse{}, nil
	}
	serve := func(b *testing.B, u grpc.UnaryServerInterceptor) {
		// The attempt's deadline is the default attempt timeout away (set
		// here, so that no earlier benchmark's time brings it near); the
		// request's grpc-timeout is that less the client's hop margin, as on
		// a real try.
		deadline := time.Now().Add(interceptor.DefaultAttemptTimeout)
		hdr := fmt.Sprintf("a=0190a5b2-7c3e-7def-8123-456789abcdef;c=0.2.1;t=1;d=%d;u=4", deadline.UnixMilli())
		base, cancel := context.WithDeadline(context.Background(), deadline.Add(-interceptor.DefaultHopMargin))
		defer cancel()
		b.ReportAllocs()
		for b.Loop() {
			ctx := metadata.NewIncomingContext(base, metadata.MD{"tollgate": {hdr}})
			ctx = grpc.NewContextWithServerTransportStream(ctx, &copyingTransport{})
			_, _ = u(ctx, &testingv1.GetRequest{}, info, spend)
		}
	}
	b.Run("server/floor", func(b *testing.B) { serve(b, floorServer) })
	b.Run("server/tollgate", func(b *testing.B) {
		u, _, err := interceptor.NewServerInterceptors(interceptor.WithTrustedPeer(interceptor.TrustAll))
		if err != nil {
			b.Fatal(err)
		}
		serve(b, u)
	})
}

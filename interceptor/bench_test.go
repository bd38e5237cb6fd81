package interceptor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// The floor: one plain header on the request and one trailer key on the
// response, through the plain grpc-go API, with no logic. tollgate's
// propagation is measured against it.
func floorClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", constantHeader)
	return invoker(ctx, method, req, reply, cc, opts...)
}

const constantHeader = "a=0190a5b2-7c3e-7def-8123-456789abcdef;c=0.2.1;t=1;d=1764474000123;u=4"

// uniqueHeaders are distinct header values of constantHeader's length. A
// propagation header is unique per attempt (it carries the attempt's ID);
// a constant one is entered in HPACK's dynamic table by the first call and
// sent as a one-byte index after that, so a floor that sends a constant
// never pays the Huffman coding on both ends that every real attempt pays.
// The values are built once, before any benchmark loop: the floor keeps no
// logic of its own.
var uniqueHeaders = sync.OnceValue(func() []string {
	out := make([]string, 1<<16)
	for i := range out {
		out[i] = fmt.Sprintf("a=0190a5b2-7c3e-7def-8123-%012x;c=0.2.1;t=1;d=1764474000123;u=4", i)
	}
	return out
})

var uniqueNext atomic.Uint64

// uniqueFloorClient is floorClient with a header value unique per call
// (cycling through 65,536, far more than HPACK's table holds).
func uniqueFloorClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	hs := uniqueHeaders()
	ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", hs[uniqueNext.Add(1)%uint64(len(hs))])
	return invoker(ctx, method, req, reply, cc, opts...)
}

// uniqueFloorDeadlineClient is uniqueFloorClient with floorDeadlineClient's
// deadline.
func uniqueFloorDeadlineClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return uniqueFloorClient(ctx, method, req, reply, cc, invoker, opts...)
}

// floorDeadlineClient is the floor plus what DESIGN.md requires of every
// tollgate call besides its logic: a deadline (grpc-timeout) and a client
// stats handler that tells sent from not sent. It shows how much of
// tollgate's cost is those two.
func floorDeadlineClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return floorClient(ctx, method, req, reply, cc, invoker, opts...)
}

type noopStats struct{}

func (noopStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (noopStats) HandleRPC(context.Context, stats.RPCStats)                         {}
func (noopStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (noopStats) HandleConn(context.Context, stats.ConnStats)                       {}

func floorServer(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	_ = metadata.ValueFromIncomingContext(ctx, "tollgate")
	resp, err := handler(ctx, req)
	_ = grpc.SetTrailer(ctx, metadata.Pairs("tollgate-spent", "1"))
	return resp, err
}

// BenchmarkPropagation compares, side by side in one run, a unary round trip
// over bufconn and loopback TCP: bare grpc-go; the floor; the floor with a
// deadline, with a no-op client stats handler, and with both (the two costs
// every tollgate call carries by design, measured apart and together);
// tollgate for a leaf call (nothing spent, no trailer); tollgate for a call
// whose handler spends one unit (trailer sent, grant settled).
//
//	go test -run '^$' -bench Propagation -benchmem -count 10 ./interceptor/ | tee new.txt
//	benchstat new.txt
func BenchmarkPropagation(b *testing.B) {
	// The unique floor's header values (some 7 MB) are built before any
	// variant runs, so that every variant, in any order and whichever of
	// them a -bench pattern selects, runs with the same live heap: a larger
	// heap makes the collector run less often, and would favour the
	// variants run while it is live.
	_ = uniqueHeaders()
	leaf, spend, trusting := benchLeaf, benchSpend, benchTrusting
	variants := []struct {
		name   string
		get    func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error)
		server []grpc.ServerOption
		client []grpc.DialOption
	}{
		{"bare", leaf, nil, nil},
		{"floor", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer)}, []grpc.DialOption{grpc.WithUnaryInterceptor(floorClient)}},
		{"floor-deadline", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer)},
			[]grpc.DialOption{grpc.WithUnaryInterceptor(floorDeadlineClient)}},
		{"floor-stats", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer)},
			[]grpc.DialOption{grpc.WithUnaryInterceptor(floorClient), grpc.WithStatsHandler(noopStats{})}},
		{"floor-deadline-stats", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer)},
			[]grpc.DialOption{grpc.WithUnaryInterceptor(floorDeadlineClient), grpc.WithStatsHandler(noopStats{})}},
		{"unique-floor", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer)}, []grpc.DialOption{grpc.WithUnaryInterceptor(uniqueFloorClient)}},
		{"unique-floor-deadline-stats", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer)},
			[]grpc.DialOption{grpc.WithUnaryInterceptor(uniqueFloorDeadlineClient), grpc.WithStatsHandler(noopStats{})}},
		{"tollgate-leaf", leaf, interceptor.ServerOptions(trusting...), interceptor.DialOptions()},
		{"tollgate-spend", spend, interceptor.ServerOptions(trusting...), interceptor.DialOptions()},
	}
	for _, tr := range []struct {
		name string
		t    testsvc.Transport
	}{{"bufconn", testsvc.Bufconn}, {"tcp", testsvc.TCP}} {
		for _, v := range variants {
			b.Run(tr.name+"/"+v.name, func(b *testing.B) {
				svc := &testsvc.Service{GetFunc: v.get}
				end := testsvc.StartT(b, tr.t, svc.Register, v.server...)
				client := testingv1.NewTestServiceClient(end.DialT(b, v.client...))
				ctx := context.Background()
				req := &testingv1.GetRequest{Key: "k"}
				if _, err := client.Get(ctx, req); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := client.Get(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRecords compares a state-changing unary call (Apply) with
// tollgate's propagation alone and with a memory store keeping its record
// (begin, finish with the response, detached handler context), over bufconn.
//
//	go test -run '^$' -bench Records -benchmem -count 10 ./interceptor/
func BenchmarkRecords(b *testing.B) {
	apply := func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{Total: 42}, nil
	}
	for _, v := range []struct {
		name  string
		store bool
	}{{"propagation", false}, {"memory-store", true}} {
		b.Run(v.name, func(b *testing.B) {
			opts := []interceptor.ServerOption{interceptor.WithTrustedPeer(interceptor.TrustAll)}
			register := func(s *grpc.Server) {}
			if v.store {
				store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithMaxRecords(1<<22), idempotency.WithMaxBytes(1<<32))
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, interceptor.WithAttemptStore(store))
				register = func(s *grpc.Server) { tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store)) }
			}
			svc := &testsvc.Service{ApplyFunc: apply}
			end := testsvc.StartT(b, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s); register(s) }, interceptor.ServerOptions(opts...)...)
			client := testingv1.NewTestServiceClient(end.DialT(b, interceptor.DialOptions()...))
			ctx := context.Background()
			req := &testingv1.ApplyRequest{Key: "acct", Amount: 1}
			// Attempts minted in the store's first skew would be outside its
			// horizon; wait that out once.
			time.Sleep(interceptor.DefaultClockSkew)
			if _, err := client.Apply(ctx, req); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := client.Apply(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

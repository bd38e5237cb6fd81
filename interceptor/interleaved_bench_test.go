package interceptor_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// BenchmarkPropagationInterleaved times, over loopback TCP, one call of each
// of three variants per iteration — the unique floor with a deadline and a
// stats handler, tollgate's leaf call and tollgate's spending call (as in
// BenchmarkPropagation), each on its own server and connection, all live at
// once — in an order that rotates every iteration, and reports each
// variant's median call time and tollgate's medians relative to the
// floor's. Calls of the variants are spread over the same stretch of time,
// so a machine whose speed drifts between the runs of BenchmarkPropagation
// (which times one variant after another) slows all three alike here. Each
// call is timed with two clock reads, the same for every variant. The ns/op
// figure is of three calls.
//
//	go test -run '^$' -bench PropagationInterleaved -count 10 ./interceptor/
func BenchmarkPropagationInterleaved(b *testing.B) {
	_ = uniqueHeaders()
	leaf, spend, trusting := benchLeaf, benchSpend, benchTrusting
	variants := []benchVariant{
		{"floor", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer)},
			[]grpc.DialOption{grpc.WithUnaryInterceptor(uniqueFloorDeadlineClient), grpc.WithStatsHandler(noopStats{})}},
		{"leaf", leaf, interceptor.ServerOptions(trusting...), interceptor.DialOptions()},
		{"spend", spend, interceptor.ServerOptions(trusting...), interceptor.DialOptions()},
	}
	medians := interleave(b, variants)
	floor := medians[0]
	b.ReportMetric(floor, "floor-ns/call")
	for i, v := range variants[1:] {
		m := medians[i+1]
		b.ReportMetric(m, v.name+"-ns/call")
		b.ReportMetric(100*(m-floor)/floor, v.name+"-over-floor-%")
	}
}

// benchLeaf is a handler that spends nothing: a leaf call.
func benchLeaf(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
	return &testingv1.GetResponse{}, nil
}

// benchSpend is a handler that spends one unit of its ledger, which stands
// for one downstream RPC: its answer carries tollgate-spent.
func benchSpend(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
	if a, ok := budget.FromContext(ctx); ok {
		_ = a.Take()
	}
	return &testingv1.GetResponse{}, nil
}

// benchTrusting makes a benchmark's server trust its client's header.
var benchTrusting = []interceptor.ServerOption{interceptor.WithTrustedPeer(interceptor.TrustAll)}

// benchVariant is one server and client set-up an interleaved benchmark
// times.
type benchVariant struct {
	name   string
	get    func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error)
	server []grpc.ServerOption
	client []grpc.DialOption
}

// interleave starts every variant on its own TCP server and connection,
// then times one call of each per iteration of b's loop, in an order that
// rotates every iteration, and returns each variant's median call time in
// nanoseconds.
func interleave(b *testing.B, variants []benchVariant) []float64 {
	clients := make([]testingv1.TestServiceClient, len(variants))
	for i, v := range variants {
		svc := &testsvc.Service{GetFunc: v.get}
		end := testsvc.StartT(b, testsvc.TCP, svc.Register, v.server...)
		clients[i] = testingv1.NewTestServiceClient(end.DialT(b, v.client...))
	}
	ctx := context.Background()
	req := &testingv1.GetRequest{Key: "k"}
	for _, c := range clients {
		if _, err := c.Get(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	times := make([][]time.Duration, len(variants))
	for i := range times {
		times[i] = make([]time.Duration, 0, 1<<16)
	}
	n := 0
	for b.Loop() {
		for k := range variants {
			i := (n + k) % len(variants)
			start := time.Now()
			if _, err := clients[i].Get(ctx, req); err != nil {
				b.Fatal(err)
			}
			times[i] = append(times[i], time.Since(start))
		}
		n++
	}
	medians := make([]float64, len(variants))
	for i, ts := range times {
		s := slices.Clone(ts)
		slices.Sort(s)
		medians[i] = float64(s[len(s)/2])
	}
	return medians
}

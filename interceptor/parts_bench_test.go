package interceptor_test

import (
	"context"
	"testing"

	"github.com/tollgate-go/tollgate/interceptor"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// BenchmarkPropagationParts takes tollgate's round trip apart, as
// BenchmarkPropagationInterleaved times it (loopback TCP, every variant on
// its own server and connection, one call of each per iteration in
// rotating order), reporting each variant's median call time relative to
// the floor's (unique floor + deadline + stats):
//
//   - floor-no-trailer: the floor's server sets no trailer, which shows
//     what one trailer key costs (tollgate's leaf call sends none, its
//     spending call one);
//
//   - client-*: tollgate's client against the floor's server, with and
//     without the trailer, which leaves tollgate's server out;
//
//   - leaf, spend: tollgate on both sides, as in BenchmarkPropagation;
//
//   - *-workers: the same servers with grpc.NumStreamWorkers(2) (an
//     experimental grpc-go option tollgate does not set), whose workers
//     keep their grown stacks where a goroutine per stream grows a new one
//     every call.
//
//     go test -run '^$' -bench PropagationParts -count 10 ./interceptor/
func BenchmarkPropagationParts(b *testing.B) {
	_ = uniqueHeaders()
	leaf, spend, trusting := benchLeaf, benchSpend, benchTrusting
	floorClient := []grpc.DialOption{grpc.WithUnaryInterceptor(uniqueFloorDeadlineClient), grpc.WithStatsHandler(noopStats{})}
	workers := grpc.NumStreamWorkers(2)
	variants := []benchVariant{
		{"floor", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer)}, floorClient},
		{"floor-no-trailer", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServerNoTrailer)}, floorClient},
		{"client-floor-server", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer)}, interceptor.DialOptions()},
		{"client-floor-server-no-trailer", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServerNoTrailer)}, interceptor.DialOptions()},
		{"leaf", leaf, interceptor.ServerOptions(trusting...), interceptor.DialOptions()},
		{"spend", spend, interceptor.ServerOptions(trusting...), interceptor.DialOptions()},
		{"floor-workers", leaf, []grpc.ServerOption{grpc.UnaryInterceptor(floorServer), workers}, floorClient},
		{"leaf-workers", leaf, append(interceptor.ServerOptions(trusting...), workers), interceptor.DialOptions()},
		{"spend-workers", spend, append(interceptor.ServerOptions(trusting...), workers), interceptor.DialOptions()},
	}
	medians := interleave(b, variants)
	floor := medians[0]
	b.ReportMetric(floor, "floor-ns/call")
	for i, v := range variants[1:] {
		b.ReportMetric(100*(medians[i+1]-floor)/floor, v.name+"-%")
	}
}

// floorServerNoTrailer is floorServer without its trailer.
func floorServerNoTrailer(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	_ = metadata.ValueFromIncomingContext(ctx, "tollgate")
	return handler(ctx, req)
}

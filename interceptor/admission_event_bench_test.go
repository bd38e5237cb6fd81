package interceptor_test

import (
	"context"
	"testing"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// BenchmarkServerAdmission measures the unary server interceptor alone
// (called directly, no transport) on a controller with a free slot: without
// a span, and under a recording span (an always-sampling SDK tracer with no
// exporter), where it adds the tollgate.admission event. The difference
// between the two is the cost of the event.
//
//	go test -run '^$' -bench ServerAdmission -benchmem -count 10 ./interceptor/
func BenchmarkServerAdmission(b *testing.B) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1 << 20, QueueItems: 16}), admission.WithDefaultClass("work"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ctrl.Close() })
	unary, _, err := interceptor.NewServerInterceptors(interceptor.WithAdmission(ctrl))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("bench")
	info := &grpc.UnaryServerInfo{FullMethod: testingv1.TestService_Get_FullMethodName}
	req := &testingv1.GetRequest{Key: "k"}
	resp := &testingv1.GetResponse{}
	handler := func(context.Context, any) (any, error) { return resp, nil }
	for _, sampled := range []bool{false, true} {
		name := "unsampled"
		if sampled {
			name = "sampled"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx := context.Background()
				var span trace.Span
				if sampled {
					ctx, span = tracer.Start(ctx, info.FullMethod)
				}
				if _, err := unary(ctx, req, info, handler); err != nil {
					b.Fatal(err)
				}
				if sampled {
					span.End()
				}
			}
		})
	}
}

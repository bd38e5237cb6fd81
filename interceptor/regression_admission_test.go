package interceptor_test

import (
	"context"
	"testing"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
)

// R5: with a recording server span (e.g. otelgrpc), every admission refusal
// dereferences a nil *Permit in server.admit (p.Class() before err check).
func TestRegressionAdmitRefusalWithRecordingSpanDoesNotPanic(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctrl.Close() })
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	spanInt := grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, sp := tp.Tracer("t").Start(ctx, info.FullMethod)
		defer sp.End()
		return h(ctx, req)
	})
	hold, release := make(chan struct{}), make(chan struct{})
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if r.GetKey() == "hold" {
			close(hold)
			<-release
		}
		return &testingv1.GetResponse{}, nil
	}}
	opts := append([]grpc.ServerOption{spanInt}, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap())...)
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, opts...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	done := make(chan error, 1)
	go func() { _, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "hold"}); done <- err }()
	<-hold
	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	close(release)
	<-done
	if o := status.OutcomeOf(err); o.Reason != status.ReasonConcurrencyFull {
		t.Fatalf("want CONCURRENCY_FULL, got %v", err)
	}
}

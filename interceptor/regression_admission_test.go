package interceptor_test

import (
	"context"
	"testing"
	"time"

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

// R4 end to end: one 1.5s Watch stream in the default class teaches the class
// a 1.5s service time; every later unary call with a 1s deadline to the idle
// server is refused DEADLINE_UNREACHABLE, so nothing completes and the
// estimate never recovers.
func TestRegressionStreamDoesNotPoisonUnaryClass(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 8, QueueItems: 8}), admission.WithDefaultClass("work"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctrl.Close() })
	svc := &testsvc.Service{
		GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return &testingv1.GetResponse{}, nil
		},
		WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			time.Sleep(1500 * time.Millisecond)
			return nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	ws, err := client.Watch(t.Context(), &testingv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := ws.Recv(); err != nil {
			break
		}
	}
	fails := 0
	var last error
	for range 10 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := client.Get(ctx, &testingv1.GetRequest{})
		cancel()
		if err != nil {
			fails++
			last = err
		}
	}
	if fails > 0 {
		t.Fatalf("%d/10 unary calls (1s deadline, idle server) refused after one 1.5s stream: %v", fails, last)
	}
}

package admission_test

import (
	"context"
	"testing"

	"github.com/tollgate-go/tollgate/admission"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc/tap"
)

// BenchmarkAdmitRelease measures the fast path: a free slot, no queue, the
// wall clock and the default (no-op) meter provider; the "sdk" variants use
// the OpenTelemetry SDK with a ManualReader and a class with tenant limits.
func BenchmarkAdmitRelease(b *testing.B) {
	b.Run("noop", func(b *testing.B) {
		benchAdmitRelease(b, admission.Class{Name: "a", Slots: 1 << 20, QueueItems: 16})
	})
	b.Run("sdk", func(b *testing.B) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer mp.Shutdown(context.Background())
		benchAdmitRelease(b, admission.Class{Name: "a", Slots: 1 << 20, QueueItems: 16, TenantRunning: 1 << 20}, admission.WithMeterProvider(mp))
	})
}

func benchAdmitRelease(b *testing.B, cl admission.Class, opts ...admission.Option) {
	ctrl, err := admission.New(append(opts, admission.WithClasses(cl))...)
	if err != nil {
		b.Fatal(err)
	}
	defer ctrl.Close()
	ctx := context.Background()
	r := admission.Request{Method: "/demo.Jobs/Heavy", Tenant: "t", Size: 128}
	b.Run("uncontended", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, err := ctrl.Admit(ctx, r)
			if err != nil {
				b.Fatal(err)
			}
			p.Release()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p, err := ctrl.Admit(ctx, r)
				if err != nil {
					b.Fatal(err)
				}
				p.Release()
			}
		})
	})
}

// BenchmarkTapHandle measures the tap's check on a class that is open.
func BenchmarkTapHandle(b *testing.B) {
	ctrl, err := admission.New()
	if err != nil {
		b.Fatal(err)
	}
	defer ctrl.Close()
	ctx := context.Background()
	info := &tap.Info{FullMethodName: "/demo.Jobs/Heavy"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := ctrl.TapHandle(ctx, info); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestTapAllocationFree checks that letting a stream through allocates
// nothing.
func TestTapAllocationFree(t *testing.T) {
	ctrl, err := admission.New()
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Close()
	info := &tap.Info{FullMethodName: "/demo.Jobs/Heavy"}
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { _, _ = ctrl.TapHandle(ctx, info) }); n != 0 {
		t.Fatalf("TapHandle allocates %v times per call", n)
	}
}

// BenchmarkRefuse measures a refusal on arrival (class full, no queue): the
// typed NOT_ADMITTED error with its jittered retry-after.
func BenchmarkRefuse(b *testing.B) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "a", Slots: 1}))
	if err != nil {
		b.Fatal(err)
	}
	defer ctrl.Close()
	ctx := context.Background()
	r := admission.Request{Method: "/demo.Jobs/Heavy", Size: 128}
	p, err := ctrl.Admit(ctx, r)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Release()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ctrl.Admit(ctx, r); err == nil {
			b.Fatal("admitted")
		}
	}
}

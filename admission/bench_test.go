package admission_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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

// BenchmarkReleaseBesideQueue measures a release (with the admission it
// pairs with) in a class that has free slots, while another class holds
// waiting requests it cannot start: its one slot is taken, and its
// waiters' deadlines are an hour away. A release in any class checks the
// waiters of every class with tenant limits for expiry before it frees its
// slot (releaseLocked); "tenant" gives the waiting class such limits,
// "plain" does not, as the baseline.
//
//	go test -run '^$' -bench ReleaseBesideQueue -benchmem -count 10 ./admission/
func BenchmarkReleaseBesideQueue(b *testing.B) {
	for _, waiting := range []int{16, 1024} {
		for _, tenant := range []bool{false, true} {
			name := fmt.Sprintf("waiting=%d/plain", waiting)
			if tenant {
				name = fmt.Sprintf("waiting=%d/tenant", waiting)
			}
			b.Run(name, func(b *testing.B) { benchReleaseBesideQueue(b, waiting, tenant) })
		}
	}
}

func benchReleaseBesideQueue(b *testing.B, waiting int, tenant bool) {
	held := admission.Class{Name: "held", Slots: 1, QueueItems: waiting, ExpectedServiceTime: time.Millisecond}
	if tenant {
		held.TenantRunning = 1
	}
	bc := newBeside(b, held)
	first := bc.admit(b, "t")
	defer first.Abandon()
	for range waiting {
		bc.wait("t")
	}
	bc.untilQueued(waiting)
	bc.loop(b)
}

// BenchmarkReleaseBesideFullTenantClass is BenchmarkReleaseBesideQueue
// beside a full class (2 slots, TenantRunning 1) whose queue holds one
// waiter of a tenant at its limit and the rest of distinct tenants: every
// unlock refreshes a full class's retry-after hint from its predicted wait,
// which must not cost in proportion to the queue's tenants.
//
//	go test -run '^$' -bench ReleaseBesideFullTenantClass -benchmem ./admission/
func BenchmarkReleaseBesideFullTenantClass(b *testing.B) {
	for _, waiting := range []int{16, 1024} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) { benchReleaseBesideFullTenantClass(b, waiting) })
	}
}

func benchReleaseBesideFullTenantClass(b *testing.B, waiting int) {
	bc := newBeside(b, admission.Class{Name: "held", Slots: 2, QueueItems: waiting, TenantRunning: 1, ExpectedServiceTime: time.Millisecond})
	p1, p2 := bc.admit(b, "t"), bc.admit(b, "u")
	defer p1.Abandon()
	defer p2.Abandon()
	for i := range waiting {
		tenant := fmt.Sprint("x", i)
		if i == 0 {
			tenant = "t" // t: at its limit with a waiter (saturated)
		}
		bc.wait(tenant)
		bc.untilQueued(i + 1) // one at a time, so that t's waiter is first
	}
	bc.loop(b)
}

// beside is a controller with a class "held" (given) and a class "free"
// with slots to spare, counting the requests that joined a queue; requests
// of "held" wait in goroutines that end at the benchmark's cleanup.
type beside struct {
	ctrl     *admission.Controller
	deadline time.Time
	ctx      context.Context
	wg       sync.WaitGroup
	mu       sync.Mutex
	queued   int
}

func newBeside(b *testing.B, held admission.Class) *beside {
	bc := &beside{deadline: time.Now().Add(time.Hour)}
	ctrl, err := admission.New(
		admission.WithClasses(held, admission.Class{Name: "free", Slots: 1 << 20}),
		admission.WithMethods("held", "/demo.Jobs/Held"),
		admission.WithMethods("free", "/demo.Jobs/Free"),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventQueued {
				bc.mu.Lock()
				bc.queued++
				bc.mu.Unlock()
			}
		}))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	bc.ctrl, bc.ctx = ctrl, ctx
	b.Cleanup(func() {
		cancel()
		bc.wg.Wait()
		ctrl.Close()
	})
	return bc
}

func (bc *beside) held(tenant string) admission.Request {
	return admission.Request{Method: "/demo.Jobs/Held", Tenant: tenant, Deadline: bc.deadline}
}

// admit admits a request of "held" for tenant, which must get a slot.
func (bc *beside) admit(b *testing.B, tenant string) *admission.Permit {
	p, err := bc.ctrl.Admit(context.Background(), bc.held(tenant))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// wait sends a request of "held" for tenant that waits until cleanup.
func (bc *beside) wait(tenant string) {
	bc.wg.Go(func() {
		if p, err := bc.ctrl.Admit(bc.ctx, bc.held(tenant)); err == nil {
			p.Abandon()
		}
	})
}

// untilQueued waits until n requests have joined a queue.
func (bc *beside) untilQueued(n int) {
	for {
		bc.mu.Lock()
		q := bc.queued
		bc.mu.Unlock()
		if q >= n {
			return
		}
		time.Sleep(10 * time.Microsecond)
	}
}

// loop times an admission and release in class "free".
func (bc *beside) loop(b *testing.B) {
	r := admission.Request{Method: "/demo.Jobs/Free", Tenant: "v", Deadline: bc.deadline}
	b.ReportAllocs()
	for b.Loop() {
		p, err := bc.ctrl.Admit(context.Background(), r)
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
}

// BenchmarkReleaseBesideHeldQueue is BenchmarkReleaseBesideQueue's tenant
// case beside a class that is "full" (1 slot) or has a slot free
// ("slotfree": 2 slots, TenantRunning 1, tenant t runs one), so that all its
// waiters are held by t's running limit alone: pump must skip such a class
// without walking its queue (classState.heldWaiters).
//
//	go test -run '^$' -bench ReleaseBesideHeldQueue -benchmem ./admission/
func BenchmarkReleaseBesideHeldQueue(b *testing.B) {
	for _, waiting := range []int{16, 1024, 4096} {
		for _, slots := range []int{1, 2} {
			name := fmt.Sprintf("waiting=%d/full", waiting)
			if slots == 2 {
				name = fmt.Sprintf("waiting=%d/slotfree", waiting)
			}
			b.Run(name, func(b *testing.B) {
				bc := newBeside(b, admission.Class{Name: "held", Slots: slots, QueueItems: waiting, TenantRunning: 1, ExpectedServiceTime: time.Millisecond})
				first := bc.admit(b, "t")
				defer first.Abandon()
				for range waiting {
					bc.wait("t")
				}
				bc.untilQueued(waiting)
				bc.loop(b)
			})
		}
	}
}

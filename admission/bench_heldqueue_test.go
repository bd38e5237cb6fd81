package admission_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
)

// BenchmarkRefusalBesideHeldQueue times an arrival refused
// CONCURRENCY_FULL in class "full" beside class "held" (2 slots,
// TenantRunning 1), whose waiters are all tenant t's, held by t's running
// limit. Every arrival pumps before deciding; pump skips "held" when none
// of its waiters can have expired, by the queue's deadline bound. In
// "stale" a short-deadline waiter of t left, so the bound is past: the
// first pump walks the held queue and sets the bound exactly, and the
// arrivals after it skip the class again.
//
//	go test -run '^$' -bench RefusalBesideHeldQueue -benchmem ./admission/
func BenchmarkRefusalBesideHeldQueue(b *testing.B) {
	for _, waiting := range []int{16, 4096} {
		for _, stale := range []bool{false, true} {
			name := fmt.Sprintf("waiting=%d/fresh", waiting)
			if stale {
				name = fmt.Sprintf("waiting=%d/stale", waiting)
			}
			b.Run(name, func(b *testing.B) { benchStalePump(b, waiting, stale) })
		}
	}
}

func benchStalePump(b *testing.B, waiting int, stale bool) {
	t0 := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	queued := 0
	ctrl, err := admission.New(
		admission.WithClock(func() time.Time { return t0 }),
		admission.WithClasses(
			admission.Class{Name: "held", Slots: 2, QueueItems: waiting + 1, TenantRunning: 1, ExpectedServiceTime: time.Millisecond},
			admission.Class{Name: "full", Slots: 1}),
		admission.WithMethods("held", "/demo.Jobs/Held"),
		admission.WithMethods("full", "/demo.Jobs/Full"),
		admission.WithStages(admission.AllStages&^admission.StageDegradation),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventQueued {
				mu.Lock()
				queued++
				mu.Unlock()
			}
		}))
	if err != nil {
		b.Fatal(err)
	}
	until := func(n int) {
		for {
			mu.Lock()
			q := queued
			mu.Unlock()
			if q >= n {
				return
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		ctrl.Close()
	}()
	held := func(d time.Time) admission.Request {
		return admission.Request{Method: "/demo.Jobs/Held", Tenant: "t", Size: -1, Deadline: d}
	}
	first, err := ctrl.AdmitAt(context.Background(), held(t0.Add(time.Hour)), t0)
	if err != nil {
		b.Fatal(err)
	}
	defer first.Abandon()
	full, err := ctrl.AdmitAt(context.Background(), admission.Request{Method: "/demo.Jobs/Full", Size: -1}, t0)
	if err != nil {
		b.Fatal(err)
	}
	defer full.Abandon()
	n := 0
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	done := make(chan struct{})
	if stale {
		go func() {
			defer close(done)
			if p, err := ctrl.AdmitAt(sctx, held(t0.Add(10*time.Millisecond)), t0); err == nil {
				p.Abandon()
			}
		}()
		n++
		until(n)
	}
	for range waiting {
		wg.Go(func() {
			if p, err := ctrl.AdmitAt(ctx, held(t0.Add(time.Hour)), t0); err == nil {
				p.Abandon()
			}
		})
	}
	n += waiting
	until(n)
	if stale {
		scancel() // leaves on the virtual clock: soonest keeps its deadline
		<-done
	}
	now := t0.Add(20 * time.Millisecond) // past the left waiter's deadline
	r := admission.Request{Method: "/demo.Jobs/Full", Size: -1}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ctrl.AdmitAt(context.Background(), r, now); err == nil {
			b.Fatal("admitted")
		}
	}
}

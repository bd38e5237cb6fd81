package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
)

// A review found that, on the real clock, when an operator lowered class
// X's slots from 2 to 1 for 50 ms while one request ran (long) and a second
// waited, the waiter stayed queued with a slot free once the override
// expired: nothing re-evaluated the controller until some unrelated call
// (an Admit, a Release, Stats) advanced the state. Here nothing else
// happens; the controller now wakes itself at the override's end.
func TestRegression14WaiterStartsWhenOverrideExpires(t *testing.T) {
	queued := make(chan struct{}, 1)
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "X", Slots: 2, QueueItems: 4}),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventQueued {
				queued <- struct{}{}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Close()
	ctx := context.Background()
	if _, err := ctrl.SetOverride(ctx, admission.Override{Actor: "op", Reason: "test", TTL: 50 * time.Millisecond, Class: "X", Slots: 1}); err != nil {
		t.Fatal(err)
	}
	p1, err := ctrl.Admit(ctx, admission.Request{Method: "/x.X/Do", Size: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Release()
	got := make(chan error, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		p, err := ctrl.Admit(wctx, admission.Request{Method: "/x.X/Do", Size: -1})
		if p != nil {
			p.Release()
		}
		got <- err
	}()
	<-queued
	timer := time.NewTimer(50*time.Millisecond + 2*time.Second)
	defer timer.Stop()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-timer.C:
		cancel()
		<-got
		t.Fatal("the override lowering X to 1 slot expired 2 s ago and X has a free slot, but its waiter was never started")
	}
}

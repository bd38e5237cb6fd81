package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A request held back only by its tenant's running limit (3 of 4 slots
// free) was judged against the class's predicted wait (25 ms: one running
// request spread over 4 slots), not its own tenant's (100 ms): with a 150 ms
// deadline it was queued although it could not start before ~100 ms nor
// finish before ~200 ms, to be dropped at dequeue (found by review). Its
// own tenant's wait counts: it is refused at once, as the caller's doing.
func TestTenantHeldBackIsJudgedByItsTenantsWait(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(
		admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}))
	r := work("/demo.Main/Do")
	r.Tenant = "a"
	p, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	r.Deadline = clk.Now().Add(150 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := c.Admit(ctx, r); done <- err }()
	select {
	case err := <-done:
		if o := status.OutcomeOf(err); o.Reason != status.ReasonDeadlineUnreachable {
			t.Fatalf("got %v, want DEADLINE_UNREACHABLE", err)
		}
	case <-time.After(200 * time.Millisecond):
		s, _ := c.Stats().Class("main")
		t.Fatalf("queued (Queued=%d) behind its own tenant's 100 ms of work with a 150 ms deadline: it can only be dropped later", s.Queued)
	}
}

// Tenant-held-back requests, once queued, were dropped at dequeue with
// DEADLINE_EXPIRED counted as the server's overload: one tenant whose own
// request ran long, with 3 of 4 slots idle throughout, degraded the server
// and shed every tenant's optional work (found by review). Such drops are
// the tenant's doing, not overload.
func TestTenantHeldBackDropsDoNotDegrade(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 4, QueueItems: 100, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "opt", Slots: 4, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"),
		admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MinDecisions: 20, EnterAfter: 1}))
	r := work("/demo.Main/Do")
	r.Tenant = "a"
	p, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 30)
	for range 30 {
		q := r
		q.Deadline = clk.Now().Add(5 * time.Second)
		go func() { _, err := c.Admit(ctx, q); errs <- err }()
	}
	for deadline := time.Now().Add(2 * time.Second); ; {
		if s, _ := c.Stats().Class("main"); s.Queued == 30 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("waiters did not queue")
		}
		time.Sleep(time.Millisecond)
	}
	clk.Advance(4950 * time.Millisecond)
	p.Release() // tenant a's own slow request ends: pump drops its expired waiters
	reasons := map[string]int{}
	for range 30 {
		reasons[status.ReasonName(status.OutcomeOf(<-errs).Reason)]++
	}
	t.Logf("tenant a's waiters (3 of 4 slots idle throughout): %v", reasons)
	clk.Advance(10 * time.Second)
	if m := c.Mode(); m != admission.ModeNormal {
		t.Errorf("one tenant held back by its own limit degraded the server: mode %v", m)
	}
}

// A waiter that gave up by its timer left its class's queue without a
// pump. When that class lends idle slots, its queue emptying makes its idle
// slot lendable, yet a waiter of another class stayed queued until some
// unrelated event (here: until its own deadline dropped it; found by
// review). Leaving the queue now starts what can start.
func TestGiveUpLetsABorrowerStart(t *testing.T) {
	c, err := admission.New(admission.WithClasses(
		admission.Class{Name: "lend", Slots: 2, QueueItems: 4, TenantRunning: 1, LendIdle: true, ExpectedServiceTime: 50 * time.Millisecond},
		admission.Class{Name: "b", Slots: 1, QueueItems: 4, ExpectedServiceTime: 50 * time.Millisecond}),
		admission.WithMethods("lend", "/demo.Lend/"), admission.WithMethods("b", "/demo.B/"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// lend: tenant x runs 1 (1 of 2 slots idle); x's second request waits
	// for its tenant's limit, short deadline: it gives up by its timer.
	px, err := c.Admit(context.Background(), admission.Request{Method: "/demo.Lend/Do", Tenant: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Release()
	gave := make(chan error, 1)
	go func() {
		_, err := c.Admit(context.Background(), admission.Request{Method: "/demo.Lend/Do", Tenant: "x", Deadline: time.Now().Add(200 * time.Millisecond)})
		gave <- err
	}()
	time.Sleep(20 * time.Millisecond)
	// b: full; its waiter cannot borrow while lend has a waiter.
	pb, err := c.Admit(context.Background(), admission.Request{Method: "/demo.B/Do"})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Release()
	got := make(chan error, 1)
	go func() {
		p, err := c.Admit(context.Background(), admission.Request{Method: "/demo.B/Do", Deadline: time.Now().Add(2 * time.Second)})
		if p != nil {
			p.Release()
		}
		got <- err
	}()
	t.Logf("lend waiter: %v", <-gave) // gives up at ~150 ms; lend's queue is empty, 1 slot idle
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("b's waiter: %v", err)
		}
	case <-time.After(500 * time.Millisecond):
		s, _ := c.Stats().Class("b")
		t.Errorf("b's waiter still queued (Queued=%d) 500 ms after lend's idle slot became lendable", s.Queued)
		t.Logf("b's waiter finally: %v", <-got)
	}
}

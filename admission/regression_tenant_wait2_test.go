package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

func waitQueued(t *testing.T, c *admission.Controller, class string, n int) {
	t.Helper()
	for dl := time.Now().Add(2 * time.Second); ; {
		if s, _ := c.Stats().Class(class); s.Queued == n {
			return
		}
		if time.Now().After(dl) {
			s, _ := c.Stats().Class(class)
			t.Fatalf("%s: Queued=%d, want %d", class, s.Queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Found by review of the first fix of TestTenantHeldBackIsJudgedByItsTenantsWait.
// TenantRunning 2, tenant a runs two requests: one ends in ~10 ms, the
// other in ~100 ms. Its next request can start in ~10 ms and finish by ~110
// ms, well within its 130 ms deadline. tenantWaitLocked spreads the SUM of
// both remainders over the limit ((10+100)/2 = 55 ms) and refuses it
// DEADLINE_UNREACHABLE; before 5da6b95 it was queued and served in time.
func TestTenantWaitIsTheSoonestEndWithALimitOf2(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(
		admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 2, ExpectedServiceTime: 100 * time.Millisecond}))
	r := work("/demo.Main/Do")
	r.Tenant = "a"
	p1, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(90 * time.Millisecond)
	p2, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Release()
	q := r
	q.Deadline = clk.Now().Add(130 * time.Millisecond)
	got := make(chan error, 1)
	go func() {
		p, err := c.Admit(context.Background(), q)
		if p != nil {
			p.Abandon()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("refused at once though it can finish at ~110 ms of 130: %v", err)
	default:
	}
	clk.Advance(10 * time.Millisecond)
	p1.Abandon() // the first ends on time: q starts at +10 ms
	if err := <-got; err != nil {
		t.Fatalf("q: %v", err)
	}
}

// Found by the same review. a request whose own tenant already has a waiter queued waits behind
// it too, but tenantWaitLocked counts only the tenant's running work: it is
// queued although it cannot finish, then dropped (the very case 5da6b95
// claims to fix, with one earlier waiter of the same tenant).
func TestTenantWaitCountsTheTenantsQueue(t *testing.T) {
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w1 := r
	w1.Deadline = clk.Now().Add(time.Second)
	done1 := make(chan error, 1)
	go func() { _, err := c.Admit(ctx, w1); done1 <- err }()
	waitQueued(t, c, "main", 1)
	w2 := r
	w2.Deadline = clk.Now().Add(250 * time.Millisecond) // starts at >=200 ms at best: cannot finish
	done2 := make(chan error, 1)
	go func() { _, err := c.Admit(ctx, w2); done2 <- err }()
	select {
	case err := <-done2:
		if o := status.OutcomeOf(err); o.Reason != status.ReasonDeadlineUnreachable {
			t.Fatalf("got %v", err)
		}
	case <-time.After(200 * time.Millisecond):
		t.Errorf("queued behind its own tenant's 100 ms running + 100 ms queued with a 250 ms deadline")
	}
	cancel()
	<-done1
}

// Found by the same review. a waiter marked byTenant keeps the mark after its tenant's request
// ended and it went on waiting for the CLASS (full, its lender busy). When
// it expires and a release frees a slot, heldByTenantLocked sees the freed
// slot and the old mark: the drop is not counted as overload.
func TestAClassFullWhileAWaiterWaitsIsOverload(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "lend", Slots: 2, QueueItems: 10, LendIdle: true, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithMethods("main", "/demo.Main/"), admission.WithMethods("lend", "/demo.Lend/"),
		admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MinDecisions: 1, MaxRefusalRatio: 0.1, EnterAfter: 1}))
	main := func(tenant string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tenant; return r }
	pb, err := c.Admit(context.Background(), main("b")) // main's only slot
	if err != nil {
		t.Fatal(err)
	}
	pa, err := c.Admit(context.Background(), main("a")) // borrows lend's idle slot
	if err != nil {
		t.Fatal(err)
	}
	wa := main("a")
	wa.Deadline = clk.Now().Add(500 * time.Millisecond)
	gotA := make(chan error, 1)
	go func() { _, err := c.Admit(context.Background(), wa); gotA <- err }() // byTenant: lend has a slot idle
	waitQueued(t, c, "main", 1)
	pl, err := c.Admit(context.Background(), work("/demo.Lend/Do")) // lend's second slot
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Release()
	gotL := make(chan *admission.Permit, 1)
	go func() { p, _ := c.Admit(context.Background(), work("/demo.Lend/Do")); gotL <- p }()
	waitQueued(t, c, "lend", 1)
	clk.Advance(time.Millisecond)
	pa.Abandon() // tenant a's request ends at once; its lend slot goes to lend's waiter
	defer (<-gotL).Release()
	if s, _ := c.Stats().Class("main"); s.Queued != 1 {
		t.Fatalf("main Queued=%d", s.Queued)
	}
	// From here on wa waits only for the class: main full, lend busy.
	clk.Advance(600 * time.Millisecond)
	pb.Release() // frees main's slot; pump drops the expired wa
	if o := status.OutcomeOf(<-gotA); o.Reason != status.ReasonDeadlineExpired {
		t.Fatalf("wa: %v", o.Reason)
	}
	clk.Advance(10 * time.Second)
	if m := c.Mode(); m != admission.ModeDegraded {
		t.Errorf("a waiter that waited ~600 ms for a full class was dropped, but the drop was not counted as overload: mode %v", m)
	}
}

// Found by the same review (fixed by pumping after a context's end on the
// real clock only). ctxEnded pumps at c.cfg.now() (the wall clock), not at the time the
// caller drives the controller with (AdmitAt). In a simulation on a virtual
// clock, cancelling one waiter drops every other deadlined waiter as
// DEADLINE_EXPIRED (or, with virtual times ahead of the wall clock, starts
// them at an earlier time than already seen). Before 5da6b95 ctxEnded read
// no clock.
func TestCtxEndedDoesNotPumpAtTheWallClockOnAVirtualClock(t *testing.T) {
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: 10 * time.Millisecond}),
		admission.WithDefaultClass("work"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC) // virtual time
	p, err := c.AdmitAt(context.Background(), work("/demo.W/Do"), t0)
	if err != nil {
		t.Fatal(err)
	}
	r1 := work("/demo.W/Do")
	r1.Deadline = t0.Add(time.Second)
	got1 := make(chan error, 1)
	go func() {
		p, err := c.AdmitAt(context.Background(), r1, t0)
		if p != nil {
			p.ReleaseAt(t0.Add(20 * time.Millisecond))
		}
		got1 <- err
	}()
	waitQueued(t, c, "work", 1)
	ctx2, cancel2 := context.WithCancel(context.Background())
	got2 := make(chan error, 1)
	go func() { _, err := c.AdmitAt(ctx2, work("/demo.W/Do"), t0); got2 <- err }()
	waitQueued(t, c, "work", 2)
	cancel2()
	<-got2
	p.ReleaseAt(t0.Add(10 * time.Millisecond)) // r1 should start now, 990 ms before its deadline
	if err := <-got1; err != nil {
		t.Fatalf("r1, at virtual t0+10ms with a t0+1s deadline: %v", err)
	}
}

package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Found by review of the second fix (TestTenantWaitIsTheSoonestEndWithALimitOf2).
// TenantRunning 2, both of tenant a's running requests end in ~10 ms,
// one waiter of a is queued. a's next request starts at ~10 ms (two slots
// free for a's two requests) and ends at ~110 ms, within its 140 ms
// deadline; that version's estimate said 10 + 100/2 = 60 ms and refused it.
func TestTenantStartWaitIsTheNextTenantSlot(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(
		admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 2, ExpectedServiceTime: 100 * time.Millisecond}))
	r := work("/demo.Main/Do")
	r.Tenant = "a"
	p1, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(90 * time.Millisecond)
	w1 := r
	w1.Deadline = clk.Now().Add(time.Second)
	got1 := make(chan *admission.Permit, 1)
	go func() { p, _ := c.Admit(context.Background(), w1); got1 <- p }()
	waitQueued(t, c, "main", 1)
	q := r
	q.Deadline = clk.Now().Add(140 * time.Millisecond)
	got := make(chan error, 1)
	go func() {
		p, err := c.Admit(context.Background(), q)
		if p != nil {
			p.Abandon()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("refused at once though it can start at ~10 ms and finish at ~110 ms of 140: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	clk.Advance(10 * time.Millisecond)
	p1.Release()
	p2.Release()
	if p := <-got1; p != nil {
		p.Abandon()
	}
	if err := <-got; err != nil {
		t.Fatalf("q: %v", err)
	}
}

// Found by the same review. W2 of tenant a waits the whole time for a class full of OTHER
// tenants' work (a runs nothing). When x's request ends, pump starts a's
// earlier waiter W1 (a is now at its limit) and then drops the expired W2:
// that version booked the drop, caused only by overload, as the tenant's
// doing. Expired waiters are now dropped before a release changes the state
// they waited in.
func TestDropBehindOtherTenantsIsOverload(t *testing.T) {
	for _, tenant2 := range []string{"a", "c"} {
		t.Run("w2-of-"+tenant2, func(t *testing.T) {
			clk := newClock()
			c := newCtl(t, clk,
				admission.WithClasses(admission.Class{Name: "main", Slots: 2, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}),
				admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MinDecisions: 1, MaxRefusalRatio: 0.1, EnterAfter: 1}))
			req := func(tn string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tn; return r }
			px, err := c.Admit(context.Background(), req("x"))
			if err != nil {
				t.Fatal(err)
			}
			py, err := c.Admit(context.Background(), req("y"))
			if err != nil {
				t.Fatal(err)
			}
			defer py.Release()
			got1 := make(chan *admission.Permit, 1)
			go func() { p, _ := c.Admit(context.Background(), req("a")); got1 <- p }()
			waitQueued(t, c, "main", 1)
			w2 := req(tenant2)
			w2.Deadline = clk.Now().Add(300 * time.Millisecond)
			got2 := make(chan error, 1)
			go func() { _, err := c.Admit(context.Background(), w2); got2 <- err }()
			waitQueued(t, c, "main", 2)
			clk.Advance(time.Second) // the class stays full of x's and y's work
			px.Release()             // W1 starts; W2 expired: dropped
			defer (<-got1).Release()
			if o := status.OutcomeOf(<-got2); o.Reason != status.ReasonDeadlineExpired {
				t.Fatalf("w2: %v", o.Reason)
			}
			clk.Advance(10 * time.Second)
			if m := c.Mode(); m != admission.ModeDegraded {
				t.Errorf("w2 (tenant %s) waited 1 s for a class full of other tenants' work, yet its drop is not overload: mode %v", tenant2, m)
			}
		})
	}
}

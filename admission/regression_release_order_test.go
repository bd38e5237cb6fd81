package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// No tenants, every stage on. A waiter B is queued (its deadline reachable
// at arrival). A2 ends after 200 ms, faster than the learned mean (280 ms):
// with what the controller learns from that release, B finishes by t0+714 ms,
// within its t0+720 ms deadline, and pump starts it. A version of
// releaseLocked dropped expired waiters before it learned from the release,
// with the stale estimate (t0+450+280 = 730 > 720), refusing B though it
// would finish (found by review). Classes without tenant limits keep the old
// order; those with them learn first.
func TestReleaseLearnsBeforeItDrops(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 2, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}))
	ctx := context.Background()
	// Warm-up: one 1 s request makes mean 280 ms > p95 126.6 ms.
	p, err := c.Admit(ctx, work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	p.Release()
	t0 := clk.Now()
	a1, err := c.Admit(ctx, work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	defer a1.Release()
	clk.Advance(250 * time.Millisecond)
	a2, err := c.Admit(ctx, work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Millisecond)
	b := work("/s.S/M")
	b.Deadline = t0.Add(720 * time.Millisecond)
	got := make(chan error, 1)
	go func() {
		p, err := c.Admit(ctx, b)
		if p != nil {
			p.Abandon()
		}
		got <- err
	}()
	waitQueued(t, c, "w", 1)
	clk.Advance(190 * time.Millisecond) // t0+450: A2 ran 200 ms
	a2.Release()
	if err := <-got; err != nil {
		st, _ := c.Stats().Class("w")
		t.Fatalf("B refused though it finishes by t0+%v (mean now %v): %v (%s)", 450*time.Millisecond+st.ServiceMean,
			st.ServiceMean, err, status.ReasonName(status.OutcomeOf(err).Reason))
	}
}

// Tenant a runs R; its waiter W waits only for R (the class has 3 free
// slots the whole time). R ends late (195 ms): a version of releaseLocked
// judged W with the old estimate (not expired), then R's long service time
// raised the estimate and pump dropped W, now that a ran nothing, as
// overload, and the controller degraded (found by review). W's wait was the
// tenant's alone: the release learns first, then drops W as it stood.
func TestATenantsLateReleaseIsNotOverload(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MinDecisions: 1, MaxRefusalRatio: 0.1, EnterAfter: 1}))
	r := work("/demo.Main/Do")
	r.Tenant = "a"
	pr, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	w := r
	w.Deadline = clk.Now().Add(300 * time.Millisecond)
	got := make(chan error, 1)
	go func() {
		p, err := c.Admit(context.Background(), w)
		if p != nil {
			p.Abandon()
		}
		got <- err
	}()
	waitQueued(t, c, "main", 1)
	clk.Advance(195 * time.Millisecond)
	pr.Release()
	if o := status.OutcomeOf(<-got); o.Reason != status.ReasonDeadlineExpired {
		t.Fatalf("w: %v", o.Reason)
	}
	clk.Advance(10 * time.Second)
	if m := c.Mode(); m != admission.ModeNormal {
		t.Errorf("W waited only for its own tenant's request (class had free slots), yet its drop counts as overload: mode %v", m)
	}
}

package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// W of tenant a waits 1 s in main (Slots 2, TenantRunning 1): main is full
// (a's R and x's request) and spare, which lends idle slots, runs its own
// request S. No slot anywhere could start W: its drop is overload. When S
// (class spare, no tenant limits) ended, a version of releaseLocked ran its
// early drop only in the releasing and the lending class, so pump judged W
// after spare's slot was freed, acquire(main) found it, and the drop was
// booked as tenant a's doing (found by review). The early drop now runs in
// every class with tenant limits.
func TestLendersReleaseDoesNotHideOverload(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 2, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "spare", Slots: 1, QueueItems: 10, LendIdle: true, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithMethods("main", "/demo.Main/"), admission.WithMethods("spare", "/demo.Spare/"),
		admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MinDecisions: 1, MaxRefusalRatio: 0.1, EnterAfter: 1}))
	ctx := context.Background()
	mreq := func(tn string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tn; return r }
	pr, err := c.Admit(ctx, mreq("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Release()
	px, err := c.Admit(ctx, mreq("x"))
	if err != nil {
		t.Fatal(err)
	}
	defer px.Release()
	ps, err := c.Admit(ctx, work("/demo.Spare/Do"))
	if err != nil {
		t.Fatal(err)
	}
	if ps.Class() != "spare" {
		t.Fatal(ps.Class())
	}
	w := mreq("a")
	w.Deadline = clk.Now().Add(300 * time.Millisecond)
	got := make(chan error, 1)
	go func() {
		p, err := c.Admit(ctx, w)
		if p != nil {
			p.Abandon()
		}
		got <- err
	}()
	waitQueued(t, c, "main", 1)
	clk.Advance(time.Second) // main full (R, x), spare busy (S)
	ps.Release()
	if o := status.OutcomeOf(<-got); o.Reason != status.ReasonDeadlineExpired {
		t.Fatalf("w: %v", o.Reason)
	}
	clk.Advance(10 * time.Second)
	if m := c.Mode(); m != admission.ModeDegraded {
		t.Errorf("W waited 1 s with no slot anywhere (main full, spare busy); drop booked as the tenant's: mode %v", m)
	}
}

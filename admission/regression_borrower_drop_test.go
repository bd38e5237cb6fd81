package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// W of tenant a waits 1 s in class main (Slots 2, TenantRunning 1), which is
// full: a's own R plus one other request. That other request ends late and
// W is dropped. When the other request is main's own (tenant x), the early
// drop in releaseLocked judges W as it waited (class full) and counts the
// drop as overload. When it is a request of another class that borrowed
// main's idle slot, a version of releaseLocked ran the early drop only for
// the releasing class, so pump judged W after main's slot was freed: the
// same wait became "the tenant's doing" and the server never degraded (found
// by review). The early drop runs in the lending class too.
func TestBorrowersReleaseDoesNotHideOverload(t *testing.T) {
	for _, occupant := range []string{"same-class", "borrower"} {
		t.Run(occupant, func(t *testing.T) {
			clk := newClock()
			c := newCtl(t, clk,
				admission.WithClasses(
					admission.Class{Name: "main", Slots: 2, QueueItems: 10, TenantRunning: 1, LendIdle: true, ExpectedServiceTime: 100 * time.Millisecond},
					admission.Class{Name: "other", Slots: 1, QueueItems: 10, ExpectedServiceTime: 100 * time.Millisecond}),
				admission.WithMethods("main", "/demo.Main/"), admission.WithMethods("other", "/demo.Other/"),
				admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MinDecisions: 1, MaxRefusalRatio: 0.1, EnterAfter: 1}))
			ctx := context.Background()
			mreq := func(tn string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tn; return r }
			pr, err := c.Admit(ctx, mreq("a"))
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Release()
			var occ *admission.Permit
			if occupant == "same-class" {
				occ, err = c.Admit(ctx, mreq("x"))
			} else {
				po, err2 := c.Admit(ctx, work("/demo.Other/Do")) // other's own slot
				if err2 != nil {
					t.Fatal(err2)
				}
				defer po.Release()
				occ, err = c.Admit(ctx, work("/demo.Other/Do")) // borrows main's idle slot
			}
			if err != nil {
				t.Fatal(err)
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
			clk.Advance(time.Second) // main stays full: R and the occupant
			occ.Release()
			if o := status.OutcomeOf(<-got); o.Reason != status.ReasonDeadlineExpired {
				t.Fatalf("w: %v", o.Reason)
			}
			clk.Advance(10 * time.Second)
			if m := c.Mode(); m != admission.ModeDegraded {
				t.Errorf("%s: W waited 1 s in a full class (R + occupant); drop not counted as overload: mode %v", occupant, m)
			}
		})
	}
}

package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
)

// Class main (1 slot, TenantRunning 1) and a lender L (1 slot, LendIdle).
// At t=0 tenant b's B holds main's slot and tenant a's R_a borrows L's. a's
// W queues (class full, a at its limit). B ends: for that instant main has
// a slot free and a is at its limit, so pump marks W held (w.held = true).
// Tenant c's C takes main's slot, L's own request Lq queues, and R_a ends:
// a now runs nothing, but main is full (C) and L no longer lends (Lq
// waits, then runs), so W waits 5 s behind another tenant's work — the
// server's queueing, not a's. When C ends W starts, but because held is
// sticky ("at some time") startLocked counts its whole wait as 0 and
// MaxQueueAge (2 s) never sees it; oldestWait does not either, since W
// started before the window closed. A momentary tenant hold erases a real
// 5 s overload wait; the README only exempts "the wait of a request that
// was so held", not the wait it spent behind a full class.
func TestRegression6StickyHeldHidesClassWait(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: time.Second},
			admission.Class{Name: "L", Slots: 1, QueueItems: 10, LendIdle: true, ExpectedServiceTime: time.Second},
			admission.Class{Name: "opt", Slots: 4, Optional: true}),
		admission.WithMethods("L", "/demo.L/"),
		admission.WithMethods("opt", "/demo.Opt/"),
		admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MaxRefusalRatio: -1, MaxQueueAge: 2 * time.Second, EnterAfter: 1}))
	req := func(method, tenant string) admission.Request {
		r := work(method)
		r.Tenant = tenant
		return r
	}
	pb := h.admitted(req("/demo.Main/Do", "b")) // main's own slot
	pa := h.admitted(req("/demo.Main/Do", "a")) // borrows L's idle slot
	w := h.queued(req("/demo.Main/Do", "a"))    // main full, a at its limit
	h.release(pb)                               // main's slot free for an instant: W marked held
	pc := h.admitted(req("/demo.Main/Do", "c")) // c takes it (W may not run)
	lq := h.queued(req("/demo.L/Do", ""))       // L's own work: L stops lending
	h.release(pa)                               // a runs nothing now; L's slot goes to Lq
	plq := h.take(lq).permit
	defer plq.Abandon()
	if _, ok := h.done[w]; ok {
		t.Fatal("W started before C ended: the scenario did not arise")
	}
	h.clk.Advance(5 * time.Second) // W waits behind c's C: main is full
	h.release(pc)
	res := h.take(w)
	if res.err != nil {
		t.Fatal(res.err)
	}
	res.permit.Abandon()
	h.drain()
	h.tick(5 * time.Second) // the 10 s window closes
	if m := h.ctrl.Mode(); m != admission.ModeDegraded {
		t.Errorf("W waited 5 s behind another tenant's work in a full class while its tenant ran nothing (MaxQueueAge 2 s), yet mode %v", m)
	}
}

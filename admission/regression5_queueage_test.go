package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
)

// MaxQueueAge (as in the README's example, beside TenantRunning) makes a
// window overloaded when a request waited that long. Tenant a runs one slow
// request R in class main (4 slots, TenantRunning 1) and sends a second, W:
// W waits only for a's own R — 3 of 4 slots idle the whole time, every
// other tenant admitted at once. Yet the window sees W as "a request that
// waited MaxQueueAge" (oldestWait counts the queue's head, deg.started the
// wait of every start, tenant-held or not) and the server degrades, shedding
// every tenant's optional work. README: the refusal or drop of a request
// held back only by its own tenant's running limit does not count, "one
// tenant over its limit is not the server's overload"; the same holds for
// the age of a waiter so held when a window closes. (The wait of a request
// that started counts in full, whatever held it: telling the tenant's part
// from the class's would take per-waiter accounting of every state change,
// and a flag set once was shown to hide real overload. The README says so.)
func TestRegression5TenantHeldWaitIsNotQueueAgeOverload(t *testing.T) {
	// still-waiting: W is at the queue's head when windows close (oldestWait).
	for _, how := range []string{"still-waiting"} {
		t.Run(how, func(t *testing.T) {
			window := time.Second
			if how == "started" {
				window = 10 * time.Second
			}
			h := newHarness(t,
				admission.WithClasses(
					admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: time.Second},
					admission.Class{Name: "opt", Slots: 4, Optional: true}),
				admission.WithMethods("opt", "/demo.Opt/"),
				admission.WithDegradation(admission.Degradation{Window: window, MaxRefusalRatio: -1, MaxQueueAge: 2 * time.Second, EnterAfter: 1}))
			a := work("/demo.Main/Do")
			a.Tenant = "a"
			pr := h.admitted(a)
			id := h.queued(a)
			for range 3 {
				b := work("/demo.Main/Do")
				b.Tenant = "b"
				h.admitted(b).Abandon() // other tenants: no wait at all
				h.drain()
				h.clk.Advance(time.Second)
			}
			if how == "started" {
				h.release(pr) // W starts after 3 s, all of them spent behind a's own R
				h.take(id).permit.Abandon()
				h.drain()
			} else {
				defer pr.Abandon()
			}
			h.tick(window)
			if m := h.ctrl.Mode(); m != admission.ModeNormal {
				t.Errorf("%s: only tenant a's own second request waited (behind a's R, 3 of 4 slots idle), yet mode %v", how, m)
			}
		})
	}
}

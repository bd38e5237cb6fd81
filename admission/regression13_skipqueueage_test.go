package admission_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
)

// One request runs and one waits (no deadline) in class main; then no call
// reaches the controller for 30 windows. With MaxQueueAge 20s, the windows
// ending from 20s on are overloaded (a request has waited MaxQueueAge by
// their end), so after 30s the controller must be Degraded. rollWindows
// closes the first windows one by one and, once i > EnterAfter+2·ExitAfter+2
// (here after 10 windows, the waiter 11s old and still "healthy"), skips
// the rest at once, assuming they would all end like the last one closed —
// but the waiter's age grows with every skipped window and crosses
// MaxQueueAge in the skipped range. Mode stays NORMAL while a request has
// waited 30s against a MaxQueueAge of 20s.
func TestRegression13SkippedWindowsSeeQueueAge(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDegradation(admission.Degradation{Window: time.Second, EnterAfter: 1, ExitAfter: 3, MaxQueueAge: 20 * time.Second}))
	p := h.admitted(work("/demo.Main/Do"))
	defer p.Abandon()
	h.queued(work("/demo.Main/Do"))
	h.clk.Advance(30 * time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeDegraded {
		t.Errorf("a request has waited 30s (MaxQueueAge 20s), yet mode %v after 30 windows without traffic", m)
	}
	h.drain()

	// Control: the same 30s closed in steps of 5s (no skip) degrades.
	h2 := newHarness(t,
		admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDegradation(admission.Degradation{Window: time.Second, EnterAfter: 1, ExitAfter: 3, MaxQueueAge: 20 * time.Second}))
	p2 := h2.admitted(work("/demo.Main/Do"))
	defer p2.Abandon()
	h2.queued(work("/demo.Main/Do"))
	for range 6 {
		h2.tick(5 * time.Second)
	}
	if m := h2.ctrl.Mode(); m != admission.ModeDegraded {
		t.Fatalf("control: mode %v after 30s in steps of 5s", m)
	}
}

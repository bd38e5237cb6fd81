package admission_test

import (
	"testing"

	"github.com/tollgate-go/tollgate/status"
)

// A waiter whose caller has gone (its context ended, its own goroutine not
// yet run to see it) was refused as if its caller listened when another
// call dropped it for a reason of the server's: SHED when its class was
// frozen or shed (Degraded), QUEUE_FULL when an override lowered its
// queue's bound, DRAINING on Close — its caller's cancellation counted and
// told as that refusal, and, on a trim, a live waiter refused QUEUE_FULL
// while the gone one kept its place. Such a waiter leaves as its context's
// ending says, whichever call finds it (cancelled; DEADLINE_EXPIRED when a
// deadline passed, as its own goroutine's ctxEnded would say), counted
// once; a trim takes it out before any live waiter, which keeps its place.
func TestR16bGoneWaiterIsNotRefusedByAnotherCall(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		for _, gone := range []r16bGone{r16bCanceled, r16bDeadline} {
			for _, by := range []r16bBy{
				{"freeze", true, status.ReasonShed},
				{"degraded", true, status.ReasonShed},
				{"trim newest", false, 0}, // the gone one is the newest
				{"trim", true, 0},         // the gone one is ahead of the live one
				{"close", true, status.ReasonDraining},
			} {
				t.Run(r16ClockName(virtual)+"/"+gone.name+"/"+by.by, func(t *testing.T) {
					r16bGoneWaiter(t, virtual, gone, by)
				})
			}
		}
	}
}

package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Review 13 found that a waiter whose context ended pumped the queues only
// on the real clock: on a controller reading a clock of its own
// (WithClock) through Admit, ctxEnded left the waiters that its leaving let
// start queued — a lending class whose only waiter left lends its idle slot
// again, and another class's waiter waited for that slot until some later
// call happened to pump. The leaving is an event at the controller's time
// like a release: what it lets start starts then.
func TestLeavingWaiterStartsWhatItsLeavingLetsStartOnTheControllersClock(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "b", Slots: 1, QueueItems: 2, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "lender", Slots: 2, QueueItems: 2, LendIdle: true, TenantRunning: 1,
				ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithMethods("lender", "/demo.Lender/"),
	)
	tr := work(lenderM)
	tr.Tenant = "t"
	running := h.admitted(tr) // the tenant's one running request: one of the lender's two slots idle
	held := h.queued(tr)      // held by its tenant's limit: the lender lends nothing while it waits
	b1 := h.admitted(work(mainM))
	b2 := h.queued(work(mainM)) // b's slot is taken; the lender has a waiter

	res := h.cancel(held) // the lender's queue empties: its idle slot is lendable
	require.Equal(t, status.ReasonUnspecified, status.OutcomeOf(res.err).Reason)
	started := false
	for _, e := range h.cancelEvents {
		started = started || (e.Kind == admission.EventStarted && e.Class == "b")
	}
	require.True(t, started, "b's waiter stays queued though the lender's idle slot is free: %v", h.cancelEvents)
	r := h.take(b2)
	require.NoError(t, r.err)
	r.permit.Release()
	b1.Release()
	running.Release()
	h.drain()
}

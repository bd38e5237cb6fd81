package admission_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// Close refuses the waiters of every class but the control class, which
// stays open so that callers can resolve the draining server's tries. A
// lending class whose queue Close empties may then lend its idle slot, and
// a control waiter that waited only because that queue was not empty must
// start then, as it would after any other call that empties the queue: it
// waited until some later release instead.
func TestR16CloseStartsAControlWaiterALenderCanNowServe(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "lender", Slots: 2, QueueItems: 2, LendIdle: true, TenantRunning: 1},
		admission.Class{Name: admission.ControlClass, Slots: 1, QueueItems: 2},
	), admission.WithMethods("lender", heavyM))
	running := admission.Request{Method: heavyM, Tenant: "x", Size: -1}
	held := h.admitted(running) // x's one running request: the lender's other slot is idle
	_ = h.queued(running)       // x's second waits for its tenant, so the lender lends nothing
	ctl := h.admitted(work(attemptM))
	waiting := h.queued(work(attemptM)) // the control slot is taken; the lender's idle one is not lent

	require.NoError(t, h.ctrl.Close())
	h.drain()
	r, started := h.done[waiting]
	require.True(t, started, "the control waiter still waits, though the lender's queue is empty and its slot idle")
	require.NoError(t, r.err)
	delete(h.done, waiting)
	r.permit.Release()
	ctl.Release()
	held.Release()
}

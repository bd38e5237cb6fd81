package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// A review found that a waiter whose context ended counted its wait
// against MaxQueueAge only up to the end of the oldest window still open:
// ctxEnded read the clock but did not close the windows that had ended
// since the controller last looked (on the real clock in Normal mode no
// timer closes them; nothing else may come), so the waiter's age was put
// in that stale window, clamped to its end, and every later window it
// waited through closed afterwards without it, healthy. Here one request
// runs and another waits through three whole windows (each of which ends
// with it 1 s, 2 s, 3 s old against a MaxQueueAge of 500 ms), then its
// client goes away: with EnterAfter 3 the controller must be Degraded.
func TestCanceledWaiterCountsInEveryWindowItWaitedThrough(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 2, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDegradation(admission.Degradation{Window: time.Second, EnterAfter: 3, MaxQueueAge: 500 * time.Millisecond, MaxRefusalRatio: -1}))
	p := h.admitted(work(mainM))
	q := h.queued(work(mainM))
	h.clk.Advance(3600 * time.Millisecond) // nothing calls the controller meanwhile
	h.cancel(q)
	require.Equal(t, admission.ModeDegraded, h.ctrl.Mode(),
		"a request waited through three windows, each ending with it older than MaxQueueAge, then left")
	h.release(p)
}

package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// Review 13 looked at where the mode is peeked rather than computed. Only
// the metrics callback peeks (peekMode, the tollgate.admission.mode gauge);
// every decision brings the state up to date first (advance). The peek
// judged an override that expired in the gap as still lowering its class's
// limits for the windows after its expiry, and so could disagree with the
// mode the next call computes: here a tenant's waiter, which after the
// override's expiry waits only for its own tenant's running request (its
// class has a slot free, so its age is no overload), was counted as the
// full class's waiter by the peek, which reported Degraded while Mode, a
// moment later at the same instant, said Normal.
func TestModeGaugeJudgesAnExpiredOverridesLimitsAsExpired(t *testing.T) {
	h, reader := newMeteredHarness(t,
		admission.WithClasses(admission.Class{Name: "main", Slots: 2, QueueItems: 4, TenantRunning: 1,
			ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MaxQueueAge: 500 * time.Millisecond}))
	r := work(mainM)
	r.Tenant = "t"
	running := h.admitted(r)
	h.override(admission.Override{Actor: "test", Reason: "review13", TTL: 300 * time.Millisecond, Class: "main", Slots: 1})
	h.queued(r) // t at its limit, and the lowered class full

	h.clk.Advance(time.Second) // the override expired at 300ms; the first window ends at 1s
	peeked := peekedMode(t, reader)
	require.Equal(t, h.ctrl.Mode(), peeked, "the mode gauge disagrees with the mode at the same instant")
	h.drain()
	running.Release()
	h.drain()
}

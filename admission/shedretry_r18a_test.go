package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

// A service owner found that a SHED refusal's retry-after ignored what the
// class waits for: a class frozen for 10 minutes, or an optional class shed
// by a forced Degraded mode for 10 minutes, suggested about one degradation
// window (200 ms windows → 103–297 ms), and so did the waiters a 1-minute
// freeze dropped. A class refused SHED until a known time suggests at least
// the time until then (jittered above it, below the bound of
// WithMaxRetryAfter); one shed by the degradation state machine, at least
// the time before the state machine can re-admit it.

// shedRA is the retry-after of a SHED refusal of r.
func (h *harness) shedRA(r admission.Request) time.Duration {
	h.t.Helper()
	err := h.refused(r, status.ReasonShed)
	ra, ok := status.RetryAfter(err)
	require.True(h.t, ok, "SHED without a retry-after: %v", err)
	return ra
}

// tapShedRA is the retry-after of the tap's SHED refusal of method m.
func tapShedRA(t *testing.T, c *admission.Controller, m string) time.Duration {
	t.Helper()
	_, err := c.TapHandle(context.Background(), &tap.Info{FullMethodName: m})
	require.Error(t, err)
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason, "%v", err)
	ra, ok := status.RetryAfter(err)
	require.True(t, ok)
	return ra
}

func requireWithin(t *testing.T, ra, lo, hi time.Duration, what string) {
	t.Helper()
	require.GreaterOrEqual(t, ra, lo, "%s: retry-after %v, want ≥ %v", what, ra, lo)
	require.Less(t, ra, hi, "%s: retry-after %v, want < %v", what, ra, hi)
}

func TestR18aFrozenClassSuggestsTheFreezesEnd(t *testing.T) {
	h := degradeHarness(t, 1, 3, admission.WithMaxRetryAfter(time.Hour))
	h.override(admission.Override{Actor: "a", Reason: "r", TTL: 10 * time.Minute, Class: "main", Freeze: true})
	for range 20 {
		requireWithin(t, h.shedRA(work(mainM)), 10*time.Minute, 15*time.Minute, "Admit")
		requireWithin(t, tapShedRA(t, h.ctrl, mainM), 10*time.Minute, 15*time.Minute, "tap")
	}
	h.tick(4 * time.Minute) // 6 minutes left
	for range 20 {
		requireWithin(t, h.shedRA(work(mainM)), 6*time.Minute, 9*time.Minute, "Admit, later")
		requireWithin(t, tapShedRA(t, h.ctrl, mainM), 6*time.Minute, 9*time.Minute, "tap, later")
	}
}

func TestR18aShedRetryAfterStaysBelowTheBound(t *testing.T) {
	h := degradeHarness(t, 1, 3) // DefaultMaxRetryAfter: 30 s
	h.override(admission.Override{Actor: "a", Reason: "r", TTL: 10 * time.Minute, Class: "main", Freeze: true})
	b := admission.DefaultMaxRetryAfter
	for range 20 {
		// The end is beyond the bound: spread over [⅔, 1) of it.
		requireWithin(t, h.shedRA(work(mainM)), b*2/3, b, "Admit")
		requireWithin(t, tapShedRA(t, h.ctrl, mainM), b*2/3, b, "tap")
	}
}

func TestR18aForcedDegradedSuggestsTheOverridesEnd(t *testing.T) {
	h := degradeHarness(t, 1, 3, admission.WithMaxRetryAfter(time.Hour))
	h.override(admission.Override{Actor: "a", Reason: "r", TTL: 10 * time.Minute, Mode: admission.ModeDegraded})
	for range 20 {
		requireWithin(t, h.shedRA(work(optM)), 10*time.Minute, 15*time.Minute, "Admit")
		requireWithin(t, tapShedRA(t, h.ctrl, optM), 10*time.Minute, 15*time.Minute, "tap")
	}
	// A later override forcing Normal for 2 minutes re-admits opt then.
	h.override(admission.Override{Actor: "a", Reason: "r", TTL: 2 * time.Minute, Mode: admission.ModeNormal})
	h.tick(2 * time.Minute) // the forced Normal ends; Degraded again for 8 minutes
	for range 20 {
		requireWithin(t, h.shedRA(work(optM)), 8*time.Minute, 12*time.Minute, "Admit, after the Normal override")
	}
}

func TestR18aFreezeDropsWaitersWithTheFreezesEnd(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 3, ExpectedServiceTime: 50 * time.Millisecond}),
		admission.WithDefaultClass("a"), admission.WithMaxRetryAfter(time.Hour))
	p := h.admitted(work("/demo.A/Do"))
	ids := []int{h.queued(work("/demo.A/Do")), h.queued(work("/demo.A/Do")), h.queued(work("/demo.A/Do"))}
	h.override(admission.Override{Actor: "x", Reason: "y", TTL: time.Minute, Class: "a", Freeze: true})
	for _, id := range ids {
		res := h.take(id)
		require.Equal(t, status.ReasonShed, status.OutcomeOf(res.err).Reason, "%v", res.err)
		ra, ok := status.RetryAfter(res.err)
		require.True(t, ok)
		requireWithin(t, ra, time.Minute, 90*time.Second, "dropped waiter")
	}
	h.release(p)
}

func TestR18aDegradedSuggestsTheFirstWindowThatCanReadmit(t *testing.T) {
	h := degradeHarness(t, 1, 3)
	require.Equal(t, admission.ModeDegraded, h.window(true)) // at 1 s; the next window ends at 2 s
	for range 20 {
		// Not before the window that may step to Recovering ends: 1 s.
		requireWithin(t, h.shedRA(work(optM)), time.Second, 1500*time.Millisecond, "Degraded")
	}
	h.tick(600 * time.Millisecond)
	for range 20 {
		// Spread over half a window at least (r18q: the clients shed
		// just before the window's end do not all come back at it).
		requireWithin(t, h.shedRA(work(optM)), 400*time.Millisecond, 900*time.Millisecond, "Degraded, later")
	}
	h.tick(400 * time.Millisecond)
	require.Equal(t, admission.ModeRecovering, h.ctrl.Mode())

	// An overloaded window while Recovering falls back to Degraded and
	// holds it for ExitAfter (3) healthy windows: the earliest re-admission
	// is three windows away, not one.
	require.Equal(t, admission.ModeDegraded, h.window(true))
	for range 20 {
		requireWithin(t, h.shedRA(work(optM)), 3*time.Second, 4500*time.Millisecond, "held Degraded")
		requireWithin(t, tapShedRA(t, h.ctrl, optM), 3*time.Second, 4500*time.Millisecond, "held Degraded, tap")
	}
	h.tick(time.Second) // one healthy window of the three
	require.Equal(t, admission.ModeDegraded, h.ctrl.Mode())
	for range 20 {
		requireWithin(t, h.shedRA(work(optM)), 2*time.Second, 3*time.Second, "held Degraded, one healthy window")
	}
}

package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

const (
	mainM = "/demo.Main/Do"
	optM  = "/demo.Opt/Do"
)

func degradeHarness(t *testing.T, enter, exit int, extra ...admission.Option) *harness {
	opts := append([]admission.Option{
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, Optional: true},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: enter, ExitAfter: exit, MinDecisions: 2, MaxRefusalRatio: 0.5,
		}),
	}, extra...)
	return newHarness(t, opts...)
}

// window plays one window of load (overloaded: one admitted and one refused
// main request; healthy: one admitted) and closes it. It returns the mode.
func (h *harness) window(overloaded bool) admission.Mode {
	p := h.admitted(work(mainM))
	if overloaded {
		h.refused(work(mainM), status.ReasonConcurrencyFull)
	}
	h.release(p)
	h.tick(time.Second)
	return h.ctrl.Mode()
}

func TestHysteresisOscillationFlipsAtMostOncePerExitPeriod(t *testing.T) {
	for _, tt := range []struct {
		name    string
		pattern []bool // overloaded windows, repeated
	}{
		{"OH", []bool{true, false}},
		{"OHH", []bool{true, false, false}},
		{"OOH", []bool{true, true, false}},
		{"OHOHH", []bool{true, false, true, false, false}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const exit = 3
			h := degradeHarness(t, 1, exit)
			var modes []admission.Mode
			for i := range 30 {
				modes = append(modes, h.window(tt.pattern[i%len(tt.pattern)]))
			}
			// A flip is a move into or out of Normal. Count them in every
			// span of exit windows.
			var flips []int
			prev := admission.ModeNormal
			for i, m := range modes {
				if (m == admission.ModeNormal) != (prev == admission.ModeNormal) {
					flips = append(flips, i)
				}
				prev = m
			}
			for i := 1; i < len(flips); i++ {
				require.GreaterOrEqual(t, flips[i]-flips[i-1], exit, "flips at windows %v", flips)
			}
			require.Len(t, flips, 1, "the oscillation never lets it return to Normal: %v", modes)
		})
	}
}

func TestDegradeShedAndStepwiseReadmission(t *testing.T) {
	h := degradeHarness(t, 1, 3)
	require.Equal(t, admission.ModeNormal, h.ctrl.Mode())
	require.Equal(t, admission.ModeDegraded, h.window(true))
	err := h.refused(work(optM), status.ReasonShed)
	ra, ok := status.RetryAfter(err)
	require.True(t, ok)
	require.GreaterOrEqual(t, ra, 500*time.Millisecond, "shed clients come back after about a window, jittered")
	h.release(h.admitted(work(mainM)))

	// Recovering: the optional class gets ⌈3·h/3⌉ slots after h healthy windows.
	require.Equal(t, admission.ModeRecovering, h.window(false))
	s, _ := h.ctrl.Stats().Class("opt")
	require.Equal(t, 1, s.Slots)
	p := h.admitted(work(optM))
	h.refused(work(optM), status.ReasonConcurrencyFull)
	h.release(p)
	require.Equal(t, admission.ModeRecovering, h.window(false))
	s, _ = h.ctrl.Stats().Class("opt")
	require.Equal(t, 2, s.Slots)
	require.Equal(t, admission.ModeNormal, h.window(false))
	s, _ = h.ctrl.Stats().Class("opt")
	require.Equal(t, 3, s.Slots)
	require.Equal(t, 3, h.ctrl.Stats().Transitions)

	// EnterAfter=2: a single overloaded window does not degrade.
	h2 := degradeHarness(t, 2, 3)
	for range 6 {
		require.Equal(t, admission.ModeNormal, h2.window(true))
		require.Equal(t, admission.ModeNormal, h2.window(false))
	}
	h2.window(true)
	require.Equal(t, admission.ModeDegraded, h2.window(true))
}

func TestQueueAgeDegrades(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 2}, admission.Class{Name: "opt", Slots: 1, QueueItems: 2, Optional: true}),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MaxQueueAge: 1500 * time.Millisecond, MaxRefusalRatio: -1}))
	p := h.admitted(work(mainM))
	q := h.queued(work(mainM))
	po := h.admitted(work(optM))
	qo := h.queued(work(optM))
	h.tick(time.Second)
	require.Equal(t, admission.ModeNormal, h.ctrl.Mode())
	evs := h.tick(time.Second) // the waiter has waited 2s at the window's end
	require.Equal(t, admission.ModeDegraded, h.ctrl.Mode())
	var dropped bool
	for _, e := range evs {
		dropped = dropped || (e.Kind == admission.EventDropped && e.Reason == status.ReasonShed)
	}
	require.True(t, dropped, "the optional class's waiters are shed on entering Degraded")
	require.Equal(t, status.ReasonShed, status.OutcomeOf(h.take(qo).err).Reason)
	h.release(po)
	h.release(p)
	r := h.take(q)
	require.NoError(t, r.err)
	h.release(r.permit)
}

func TestOverrides(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	h := degradeHarness(t, 1, 3, admission.WithTracerProvider(tp), admission.WithMaxOverrideTTL(time.Minute))
	ctx := context.Background()

	for _, bad := range []admission.Override{
		{Reason: "r", TTL: time.Second, Class: "main", Freeze: true},
		{Actor: "a", Reason: "r", TTL: 2 * time.Minute, Class: "main", Freeze: true},
		{Actor: "a", Reason: "r", TTL: time.Second, Class: "main"},
		{Actor: "a", Reason: "r", TTL: time.Second, Class: "main", Slots: 2},
		{Actor: "a", Reason: "r", TTL: time.Second, Class: admission.ControlClass, Freeze: true},
		{Actor: "a", Reason: "r", TTL: time.Second, Class: "nope", Freeze: true},
		{Actor: "a", Reason: "r", TTL: time.Second, Mode: 9},
	} {
		_, err := h.ctrl.SetOverride(ctx, bad)
		require.ErrorIs(t, err, admission.ErrInvalidOverride, "%+v", bad)
	}

	// Freeze: refused with SHED until it expires by itself.
	p := h.admitted(work(optM))
	id, err := h.ctrl.SetOverride(ctx, admission.Override{Actor: "alice", Reason: "incident 42", TTL: 10 * time.Second, Class: "main", Freeze: true})
	require.NoError(t, err)
	h.drain()
	h.refused(work(mainM), status.ReasonShed)
	require.Len(t, h.ctrl.Overrides(), 1)
	h.tick(10 * time.Second)
	require.Empty(t, h.ctrl.Overrides())
	h.release(h.admitted(work(mainM)))
	require.False(t, h.ctrl.ClearOverride(ctx, id))

	// Lower limits: opt from 3 slots to 1; cleared early.
	id, err = h.ctrl.SetOverride(ctx, admission.Override{Actor: "bob", Reason: "db pool", TTL: 30 * time.Second, Class: "opt", Slots: 1})
	require.NoError(t, err)
	h.drain()
	h.refused(work(optM), status.ReasonConcurrencyFull) // p holds the one slot
	require.True(t, h.ctrl.ClearOverride(ctx, id))
	h.drain()
	h.release(h.admitted(work(optM)))
	h.release(p)

	// Lower a queue bound: heavy work in "q" may wait 3, lowered to 1.
	hq := newHarness(t, admission.WithClasses(admission.Class{Name: "q", Slots: 1, QueueItems: 3}))
	_, err = hq.ctrl.SetOverride(ctx, admission.Override{Actor: "dan", Reason: "memory", TTL: time.Second, Class: "q", QueueItems: 1})
	require.NoError(t, err)
	hp := hq.admitted(work(heavyM))
	hw := hq.queued(work(heavyM))
	hq.refused(work(heavyM), status.ReasonQueueFull)
	hq.tick(time.Second) // expired: the configured bound is back
	hw2 := hq.queued(work(heavyM))
	hq.release(hp)
	r1 := hq.take(hw)
	require.NoError(t, r1.err)
	hq.release(r1.permit)
	r2 := hq.take(hw2)
	require.NoError(t, r2.err)
	hq.release(r2.permit)

	// Force a mode: Degraded sheds the optional class although load is fine.
	_, err = h.ctrl.SetOverride(ctx, admission.Override{Actor: "carol", Reason: "drill", TTL: 5 * time.Second, Mode: admission.ModeDegraded})
	require.NoError(t, err)
	h.drain()
	require.Equal(t, admission.ModeDegraded, h.ctrl.Mode())
	h.refused(work(optM), status.ReasonShed)
	h.tick(5 * time.Second)
	require.Equal(t, admission.ModeNormal, h.ctrl.Mode())
	h.release(h.admitted(work(optM)))

	actions := map[string]int{}
	for _, sp := range rec.Ended() {
		if sp.Name() != "tollgate.admission.override" {
			continue
		}
		for _, ev := range sp.Events() {
			set := attribute.NewSet(ev.Attributes...)
			a, _ := set.Value("action")
			actor, _ := set.Value("actor")
			reason, _ := set.Value("reason")
			require.NotEmpty(t, actor.AsString())
			require.NotEmpty(t, reason.AsString())
			actions[a.AsString()]++
		}
	}
	require.Equal(t, map[string]int{"set": 3, "expire": 2, "clear": 1}, actions)
}

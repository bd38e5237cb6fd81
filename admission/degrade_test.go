package admission_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/tap"
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

// steppedOptHarness is a harness of main (1 slot) and the optional opt
// (3 slots, 3 queued, 10ms of work, optM), degrading by 1s windows
// (EnterAfter 1, ExitAfter 3, MinDecisions minDecisions, MaxRefusalRatio
// 0.5), brought through three windows to Recovering with opt's step grown
// to 2 slots.
func steppedOptHarness(t *testing.T, minDecisions int) *harness {
	t.Helper()
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, QueueItems: 3, Optional: true, ExpectedServiceTime: 10 * time.Millisecond},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: minDecisions, MaxRefusalRatio: 0.5,
		}))
	h.window(true)      // window 1: main overloaded → Degraded
	h.tick(time.Second) // window 2 healthy → Recovering
	if m := h.ctrl.Mode(); m != admission.ModeRecovering {
		t.Fatalf("mode %v, want RECOVERING", m)
	}
	h.tick(time.Second) // window 3 healthy: the step grows to 2 slots
	if st, _ := h.ctrl.Stats().Class("opt"); st.Slots != 2 || h.ctrl.Mode() != admission.ModeRecovering {
		t.Fatalf("opt slots %d mode %v, want 2 RECOVERING", st.Slots, h.ctrl.Mode())
	}
	return h
}

// optDue is a unary request of opt's (optM) due in d.
func (h *harness) optDue(d time.Duration) admission.Request {
	r := work(optM)
	r.Deadline = h.clk.Now().Add(d)
	return r
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

// The controller degrades because class main refuses QUEUE_FULL to 20 of
// 20 requests in a window. In the next window main is just as overloaded
// (20 of 20 refused QUEUE_FULL again), but the optional class's callers keep
// arriving and are refused SHED — by the degraded mode itself. refusedN
// counts every SHED refusal as a healthy decision, so 100 shed requests
// dilute main's refusal ratio to 20/120 and the window reads healthy: the
// controller moves to Recovering and re-admits the optional class while
// the main class is still fully overloaded. The shedding that degradation
// does is neither load nor health (like TENANT_LIMIT, see
// TestTenantLimitRefusalsDoNotHideOverload); seed 002: "a
// falling error rate caused by rejecting nearly everything is not
// recovery". With opt quiet the same window stays Degraded.
func TestShedRefusalsDoNotHideOverload(t *testing.T) {
	for _, optTraffic := range []bool{false, true} {
		t.Run(fmt.Sprintf("optTraffic=%v", optTraffic), func(t *testing.T) {
			h := newHarness(t,
				admission.WithClasses(
					admission.Class{Name: "main", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond},
					admission.Class{Name: "opt", Slots: 4, QueueItems: 4, Optional: true}),
				admission.WithMethods("opt", "/demo.Opt/"),
				admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 1, ExitAfter: 3}))
			p := h.admitted(work("/demo.Main/Do"))
			defer p.Abandon()
			h.queued(work("/demo.Main/Do"))
			for range 20 {
				h.refused(work("/demo.Main/Do"), status.ReasonQueueFull)
			}
			h.tick(time.Second)
			if m := h.ctrl.Mode(); m != admission.ModeDegraded {
				t.Fatalf("setup: mode %v, want DEGRADED", m)
			}
			// Window 2: main exactly as overloaded as in window 1.
			for range 20 {
				h.refused(work("/demo.Main/Do"), status.ReasonQueueFull)
			}
			if optTraffic {
				for range 100 {
					h.refused(work("/demo.Opt/Do"), status.ReasonShed)
				}
			}
			h.tick(time.Second)
			if m := h.ctrl.Mode(); m != admission.ModeDegraded {
				t.Errorf("main refused 20 of 20 QUEUE_FULL again, yet mode %v (optional traffic shed: %v)", m, optTraffic)
			}
		})
	}
}

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
func TestSkippedWindowsSeeQueueAge(t *testing.T) {
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

// Class main is saturated for 5 windows (its one slot held, its queue
// full) and every arrival, 50 per window, is refused QUEUE_FULL. With
// EnterAfter 2 that is 5 consecutive overloaded windows: Degraded. When
// Admit refuses them, each refusal closes the elapsed windows first, and
// the controller degrades. When the tap refuses them (the interceptor's
// default), nothing closes a window while the mode is Normal (the tap's due
// time is set only when not Normal), and foldTapRefusals puts every tap
// refusal made since the last roll into the first window it closes: all
// 250 land in window 1, windows 2–5 read empty and healthy, and the mode
// stays NORMAL through 5 windows of total overload. Same load, two
// verdicts, depending only on which layer refused.
func TestTapRefusalsKeepTheirWindow(t *testing.T) {
	for _, viaTap := range []bool{false, true} {
		t.Run(fmt.Sprintf("viaTap=%v", viaTap), func(t *testing.T) {
			h := newHarness(t,
				admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 1}),
				admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 2, ExitAfter: 3}))
			p := h.admitted(work("/demo.Main/Do"))
			defer p.Abandon()
			h.queued(work("/demo.Main/Do"))
			info := &tap.Info{FullMethodName: "/demo.Main/Do"}
			for range 5 {
				for range 50 {
					if viaTap {
						_, err := h.ctrl.TapHandle(context.Background(), info)
						if status.OutcomeOf(err).Reason != status.ReasonQueueFull {
							t.Fatalf("tap: %v, want QUEUE_FULL", err)
						}
					} else {
						h.refused(work("/demo.Main/Do"), status.ReasonQueueFull)
					}
				}
				h.clk.Advance(time.Second)
			}
			m := h.ctrl.Mode()
			h.drain()
			if m != admission.ModeDegraded {
				t.Errorf("5 consecutive windows with every arrival refused QUEUE_FULL (EnterAfter 2), mode %v (refused by the tap: %v)", m, viaTap)
			}
		})
	}
}

// The controller degrades, the overload ends and the server goes quiet for
// 10 windows. The tollgate.admission.mode gauge's callback reads c.mode()
// without closing the elapsed windows (or expiring overrides) first, unlike
// Mode and Stats: a scrape reports DEGRADED (2) for as long as no request
// arrives, while Mode() at the same instant reports NORMAL — the exported
// mode is whatever it was at the last call, not the mode now. Same for a
// forced mode whose override has expired.
func TestModeGaugeIsCurrent(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	h := newHarness(t, admission.WithMeterProvider(mp),
		admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 1, ExitAfter: 3}))
	p := h.admitted(work("/demo.Main/Do"))
	q := h.queued(work("/demo.Main/Do"))
	for range 20 {
		h.refused(work("/demo.Main/Do"), status.ReasonQueueFull)
	}
	h.tick(time.Second)
	require.Equal(t, admission.ModeDegraded, h.ctrl.Mode())
	h.release(p)
	h.release(h.take(q).permit)

	h.clk.Advance(10 * time.Second) // 10 quiet windows: no call reaches the controller
	gauge := func() int64 {
		ms := collect(t, reader)
		g := ms["tollgate.admission.mode"].Data.(metricdata.Gauge[int64])
		require.Len(t, g.DataPoints, 1)
		return g.DataPoints[0].Value
	}
	scraped := gauge()
	now := h.ctrl.Mode()
	h.drain()
	if scraped != int64(now) {
		t.Errorf("mode gauge scraped %d (%v) after 10 healthy windows, while Mode() now says %v",
			scraped, admission.Mode(scraped), now)
	}
}

// An optional class (3 slots, no queue) carries a steady load of three
// concurrent requests, which its configured slots serve without a single
// refusal. One overloaded window of the main class degrades the controller;
// the optional class is shed, then re-admitted in steps while Recovering
// (1 slot after one healthy window). The refusals that the controller's own
// step makes (CONCURRENCY_FULL for the 2nd and 3rd of each round) are
// counted as overload, so every Recovering window is overloaded and sends
// the controller back to Degraded: it never returns to Normal although the
// main class is idle and the optional load fits the configuration.
func TestSteppedReadmissionRefusalsNeverLetItRecover(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, Optional: true},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
		}))
	// Sanity: at full capacity the optional load is never refused.
	optRound := func() (admitted, refused int) {
		var ps []*admission.Permit
		for range 3 {
			id, e := h.arrive(work(optM))
			r := h.take(id)
			if e.Kind == admission.EventAdmitted {
				ps = append(ps, r.permit)
				admitted++
			} else {
				refused++
			}
		}
		for _, p := range ps {
			h.release(p)
		}
		return admitted, refused
	}
	if a, r := optRound(); a != 3 || r != 0 {
		t.Fatalf("Normal: optional round admitted %d refused %d", a, r)
	}
	h.tick(time.Second)
	// One overloaded window of main: Degraded.
	p := h.admitted(work(mainM))
	h.refused(work(mainM), status.ReasonConcurrencyFull)
	h.release(p)
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeDegraded {
		t.Fatalf("mode %v, want DEGRADED", m)
	}
	var modes []admission.Mode
	normal := false
	for range 40 {
		for range 5 {
			optRound()
		}
		h.tick(time.Second)
		m := h.ctrl.Mode()
		modes = append(modes, m)
		if m == admission.ModeNormal {
			normal = true
			break
		}
	}
	if !normal {
		t.Fatalf("40 windows with main idle and an optional load that fits its 3 configured slots: never NORMAL again; modes %v", modes)
	}
}

// A review found that the first fix decided whether the tap's refusals are "stepped" (no overload)
// when they are folded into the window, at its end, not when the tap made
// them. An operator forces RECOVERING for 500 ms: the optional class is held
// to 1 of its 3 slots, and its refusals are the controller's own step. The
// same refusals made by Admit in that period count in no window; made by the
// tap, they are folded after the forced mode expired (advance expires
// overrides before it rolls windows), counted as overload, and the
// controller degrades, shedding the optional class, for a window whose only
// refusals were the step's.
func TestTapSteppedRefusalsJudgedAtFoldTime(t *testing.T) {
	for _, byTap := range []bool{false, true} {
		name := "admit"
		if byTap {
			name = "tap"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t,
				admission.WithClasses(
					admission.Class{Name: "main", Slots: 1},
					admission.Class{Name: "opt", Slots: 3, Optional: true},
				),
				admission.WithMethods("opt", optM),
				admission.WithDegradation(admission.Degradation{
					Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
				}))
			if _, err := h.ctrl.SetOverride(context.Background(), admission.Override{
				Actor: "op", Reason: "test", TTL: 500 * time.Millisecond, Mode: admission.ModeRecovering,
			}); err != nil {
				t.Fatal(err)
			}
			h.drain()
			p := h.admitted(work(optM)) // the step's one slot
			for range 10 {
				if byTap {
					if _, err := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: optM}); status.OutcomeOf(err).Reason != status.ReasonConcurrencyFull {
						t.Fatalf("tap: %v", err)
					}
				} else {
					h.refused(work(optM), status.ReasonConcurrencyFull)
				}
			}
			h.release(p)
			h.tick(time.Second)
			if m := h.ctrl.Mode(); m != admission.ModeNormal {
				t.Fatalf("refused only by the forced RECOVERING step (by %s), yet the window was counted overloaded: mode %v", name, m)
			}
		})
	}
}

// A review found that the first fix stopped counting the refusals that Recovering's stepped re-admission
// of an optional class causes, so that an optional load that fits the
// class's configured slots lets the controller return to Normal. The same
// step's waits are still an overload signal: an optional class with a queue
// (3 slots, 3 queued) carries three concurrent requests of 250 ms, which its
// configured slots run at once, without a wait. Stepped to one slot while
// Recovering, two of them wait in the queue behind it, their wait reaches
// MaxQueueAge (200 ms), every Recovering window is overloaded, and the
// controller never returns to Normal with the main class idle — the bug
// 0e0b954 fixed, for any optional class that queues instead of refusing.
func TestSteppedWaitsStillNeverLetItRecover(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, QueueItems: 3, Optional: true},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
			MaxQueueAge: 200 * time.Millisecond,
		}))
	// One window's optional load: three requests of 250 ms each, arriving
	// together; it returns how many of them had to wait.
	optRound := func() (waited int) {
		var running []*admission.Permit
		var queued []int
		for range 3 {
			id, e := h.arrive(work(optM))
			switch e.Kind {
			case admission.EventAdmitted:
				running = append(running, h.take(id).permit)
			case admission.EventQueued:
				queued = append(queued, id)
				waited++
			case admission.EventRefused:
				h.take(id)
				if e.Reason != status.ReasonShed { // shed while Degraded
					t.Fatalf("optional request refused %v", status.ReasonName(e.Reason))
				}
			default:
				t.Fatalf("optional request %v %v", e.Kind, status.ReasonName(e.Reason))
			}
		}
		for len(running) > 0 {
			h.tick(250 * time.Millisecond)
			for _, p := range running {
				h.release(p)
			}
			running = running[:0]
			rest := queued[:0]
			for _, id := range queued {
				if r, ok := h.done[id]; ok {
					delete(h.done, id)
					if r.err != nil {
						t.Fatalf("waiter %d: %v", id, r.err)
					}
					running = append(running, r.permit)
				} else {
					rest = append(rest, id)
				}
			}
			queued = rest
		}
		return waited
	}
	// Advance to the end of the current 1 s window.
	endWindow := func() {
		since := h.clk.Now().Sub(epoch) % time.Second
		h.tick(time.Second - since)
	}
	if w := optRound(); w != 0 {
		t.Fatalf("Normal: %d optional requests waited; the load fits the configured slots", w)
	}
	endWindow()
	// One overloaded window of main: Degraded.
	p := h.admitted(work(mainM))
	h.refused(work(mainM), status.ReasonConcurrencyFull)
	h.release(p)
	endWindow()
	if m := h.ctrl.Mode(); m != admission.ModeDegraded {
		t.Fatalf("mode %v, want DEGRADED", m)
	}
	var modes []admission.Mode
	for range 40 {
		optRound()
		endWindow()
		m := h.ctrl.Mode()
		modes = append(modes, m)
		if m == admission.ModeNormal {
			return
		}
	}
	t.Fatalf("40 windows with main idle and an optional load that fits its 3 configured slots without a wait: never NORMAL again; modes %v", modes)
}

// A review found that Recovering's step left the waits it causes out of every window, but only
// while the class is stepped: the requests that queued behind the lowered
// slots start when the step ends (the mode becomes Normal and pump starts
// them in the same roll), and deg.started then counts their whole wait —
// a wait the step alone caused — in the first Normal window. With
// MaxQueueAge set, that window is overloaded and the controller goes
// straight back to Degraded, although the optional load (3 requests) never
// exceeded the class's 3 configured slots: the doc promises the cycling
// only for a load that exceeds even the configured slots.
func TestSteppedWaitCountsOnceTheStepEnds(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, QueueItems: 3, Optional: true},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
			MaxQueueAge: 200 * time.Millisecond,
		}))
	// Window 1: main overloaded → Degraded.
	p := h.admitted(work(mainM))
	h.refused(work(mainM), status.ReasonConcurrencyFull)
	h.release(p)
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeDegraded {
		t.Fatalf("mode %v, want DEGRADED", m)
	}
	// Window 2 healthy → Recovering, opt stepped to 1 slot.
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeRecovering {
		t.Fatalf("mode %v, want RECOVERING", m)
	}
	opt := func() admission.Request {
		r := work(optM)
		r.Deadline = h.clk.Now().Add(time.Minute)
		return r
	}
	a := h.admitted(opt())
	defer a.Abandon()
	b := h.queued(opt())
	c := h.queued(opt())
	// Windows 3 and 4 healthy: the step grows to 2 slots (b starts), then
	// the controller is Normal with 3 slots (c starts, after a 2 s wait
	// the step caused).
	h.tick(time.Second)
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("mode %v, want NORMAL", m)
	}
	for _, id := range []int{b, c} {
		r := h.take(id)
		if r.err != nil {
			t.Fatalf("waiter %d: %v", id, r.err)
		}
		defer r.permit.Abandon()
	}
	for _, e := range h.log {
		if e.Kind == admission.EventStarted || e.Kind == admission.EventMode {
			t.Logf("%v %v waited %v at %v", e.Kind, e.Mode, e.Waited, e.At.Sub(epoch))
		}
	}
	// Window 5: nothing arrives, nothing waits; main idle.
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("first Normal window with nothing waiting and main idle: mode %v, want NORMAL (the wait Recovering's step caused counted once the step ended)", m)
	}
}

// A review found that the previous fix moved Recovering's "stepped" exemption from decideLocked's refuse
// switch (case callerOnly, c.stepped(cs)) into countRefusal; but the
// classFull branch of that switch calls c.deg.refused directly, so a
// TENANT_LIMIT refusal that the class's lack of room caused (TenantQueueWork
// below one request's learned work, in a class with no slot) counts as
// overload again while the class is stepped — the lowered slots are the
// step's, not load. 0e0b954 exempted it; e33c801 regressed it. Here an
// optional load of 3 tenants' single requests, within the class's 3
// configured slots, throws the controller from Recovering back to Degraded.
func TestSteppedClassFullTenantLimitCountsAsOverload(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 3, QueueItems: 3, Optional: true,
				ExpectedServiceTime: time.Second, TenantQueueWork: 100 * time.Millisecond},
		),
		admission.WithMethods("opt", optM),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 3, MinDecisions: 2, MaxRefusalRatio: 0.5,
		}))
	// Window 1: main overloaded → Degraded; window 2 healthy → Recovering.
	p := h.admitted(work(mainM))
	h.refused(work(mainM), status.ReasonConcurrencyFull)
	h.release(p)
	h.tick(time.Second)
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeRecovering {
		t.Fatalf("mode %v, want RECOVERING", m)
	}
	st, _ := h.ctrl.Stats().Class("opt")
	if st.Slots != 1 {
		t.Fatalf("opt slots %d, want the first step's 1", st.Slots)
	}
	// Three tenants, one request each: the first runs on the stepped slot;
	// the others find the stepped class full and are refused TENANT_LIMIT
	// (their one request's learned work exceeds TenantQueueWork) — the
	// step's doing.
	opt := func(tenant string) admission.Request {
		r := work(optM)
		r.Tenant = tenant
		r.Deadline = h.clk.Now().Add(time.Minute)
		return r
	}
	a := h.admitted(opt("t0"))
	defer a.Abandon()
	for i := 1; i < 3; i++ {
		h.refused(opt(fmt.Sprintf("t%d", i)), status.ReasonTenantLimit)
	}
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeRecovering {
		t.Fatalf("after a window whose only refusals the step caused: mode %v, want RECOVERING", m)
	}
}

// Waiters of an optional class that queue behind Recovering's lowered slots
// and run out of time while the class is stepped are dropped, on the
// virtual clock, only by the next pump: the one at the end of the roll that
// ends the step (rollWindows steps to Normal first, then pumps). The drop
// is then judged unstepped (countRefusal reads c.stepped now) and counts as
// two DEADLINE_EXPIRED overload refusals in the first Normal window, which
// throws the controller straight back to Degraded — although the waits and
// the expiry were entirely the step's (the real clock's per-waiter timer
// would have dropped them while the class was stepped, uncounted).
func TestSteppedExpiryCountsAfterTheStep(t *testing.T) {
	// Window 1: main overloaded → Degraded; window 2 healthy → Recovering.
	// Window 3 healthy: the step grows to 2 slots.
	h := steppedOptHarness(t, 2)
	a1 := h.admitted(h.optDue(time.Minute))
	defer a1.Abandon()
	a2 := h.admitted(h.optDue(time.Minute))
	defer a2.Abandon()
	// Two more, within the class's 3 configured slots, wait behind the
	// step's 2 and run out of time half-way through window 4.
	b := h.queued(h.optDue(500 * time.Millisecond))
	c := h.queued(h.optDue(500 * time.Millisecond))
	// Window 4 healthy: Normal, the step ends; b and c are dropped.
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("mode %v, want NORMAL", m)
	}
	for _, id := range []int{b, c} {
		if r := h.take(id); r.err == nil {
			r.permit.Abandon()
			t.Fatalf("waiter %d started; want it dropped", id)
		}
	}
	for _, e := range h.log {
		if e.Kind == admission.EventDropped || e.Kind == admission.EventMode {
			t.Logf("%v %v %v at %v", e.Kind, e.Mode, status.ReasonName(e.Reason), e.At.Sub(epoch))
		}
	}
	// Window 5: nothing arrives, main idle.
	h.tick(time.Second)
	if m := h.ctrl.Mode(); m != admission.ModeNormal {
		t.Fatalf("first Normal window, main idle, no new load: mode %v, want NORMAL (the drops Recovering's step caused counted once the step ended)", m)
	}
}

// After a fall-back from Recovering (hold set), an hour without traffic is an
// hour of healthy windows: the controller must be Normal, whatever ExitAfter.
func TestIdleHourAfterHoldIsNormal(t *testing.T) {
	for _, exit := range []int{3, 8, 10, 20} {
		h := degradeHarness(t, 1, exit)
		h.window(true)                                        // O: Degraded
		h.window(false)                                       // H: Recovering
		if m := h.window(true); m != admission.ModeDegraded { // O: re-entry, hold
			t.Fatalf("exit %d: mode %v after re-entry", exit, m)
		}
		h.tick(time.Hour)
		if m := h.ctrl.Mode(); m != admission.ModeNormal {
			st, _ := h.ctrl.Stats().Class("opt")
			t.Errorf("exit %d: after an idle hour the mode is %v (optional class slots %d of 3)", exit, m, st.Slots)
		}
	}
}

// W of tenant a waits 1 s in class main (Slots 2, TenantRunning 1), which is
// full: a's own R plus one other request. That other request ends late and
// W is dropped. When the other request is main's own (tenant x), the early
// drop in releaseLocked judges W as it waited (class full) and counts the
// drop as overload. When it is a request of another class that borrowed
// main's idle slot, a version of releaseLocked ran the early drop only for
// the releasing class, so pump judged W after main's slot was freed: the
// same wait became "the tenant's doing" and the server never degraded (found
// by review). The early drop runs in the lending class too.
func TestBorrowersReleaseDoesNotHideOverload(t *testing.T) {
	for _, occupant := range []string{"same-class", "borrower"} {
		t.Run(occupant, func(t *testing.T) {
			clk := newClock()
			c := newCtl(t, clk,
				admission.WithClasses(
					admission.Class{Name: "main", Slots: 2, QueueItems: 10, TenantRunning: 1, LendIdle: true, ExpectedServiceTime: 100 * time.Millisecond},
					admission.Class{Name: "other", Slots: 1, QueueItems: 10, ExpectedServiceTime: 100 * time.Millisecond}),
				admission.WithMethods("main", "/demo.Main/"), admission.WithMethods("other", "/demo.Other/"),
				admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MinDecisions: 1, MaxRefusalRatio: 0.1, EnterAfter: 1}))
			ctx := context.Background()
			mreq := func(tn string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tn; return r }
			pr, err := c.Admit(ctx, mreq("a"))
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Release()
			var occ *admission.Permit
			if occupant == "same-class" {
				occ, err = c.Admit(ctx, mreq("x"))
			} else {
				po, err2 := c.Admit(ctx, work("/demo.Other/Do")) // other's own slot
				if err2 != nil {
					t.Fatal(err2)
				}
				defer po.Release()
				occ, err = c.Admit(ctx, work("/demo.Other/Do")) // borrows main's idle slot
			}
			if err != nil {
				t.Fatal(err)
			}
			w := mreq("a")
			w.Deadline = clk.Now().Add(300 * time.Millisecond)
			got := make(chan error, 1)
			go func() {
				p, err := c.Admit(ctx, w)
				if p != nil {
					p.Abandon()
				}
				got <- err
			}()
			waitQueued(t, c, "main", 1)
			clk.Advance(time.Second) // main stays full: R and the occupant
			occ.Release()
			if o := status.OutcomeOf(<-got); o.Reason != status.ReasonDeadlineExpired {
				t.Fatalf("w: %v", o.Reason)
			}
			clk.Advance(10 * time.Second)
			if m := c.Mode(); m != admission.ModeDegraded {
				t.Errorf("%s: W waited 1 s in a full class (R + occupant); drop not counted as overload: mode %v", occupant, m)
			}
		})
	}
}

// W of tenant a waits 1 s in main (Slots 2, TenantRunning 1): main is full
// (a's R and x's request) and spare, which lends idle slots, runs its own
// request S. No slot anywhere could start W: its drop is overload. When S
// (class spare, no tenant limits) ended, a version of releaseLocked ran its
// early drop only in the releasing and the lending class, so pump judged W
// after spare's slot was freed, acquire(main) found it, and the drop was
// booked as tenant a's doing (found by review). The early drop now runs in
// every class with tenant limits.
func TestLendersReleaseDoesNotHideOverload(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(
			admission.Class{Name: "main", Slots: 2, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "spare", Slots: 1, QueueItems: 10, LendIdle: true, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithMethods("main", "/demo.Main/"), admission.WithMethods("spare", "/demo.Spare/"),
		admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MinDecisions: 1, MaxRefusalRatio: 0.1, EnterAfter: 1}))
	ctx := context.Background()
	mreq := func(tn string) admission.Request { r := work("/demo.Main/Do"); r.Tenant = tn; return r }
	pr, err := c.Admit(ctx, mreq("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Release()
	px, err := c.Admit(ctx, mreq("x"))
	if err != nil {
		t.Fatal(err)
	}
	defer px.Release()
	ps, err := c.Admit(ctx, work("/demo.Spare/Do"))
	if err != nil {
		t.Fatal(err)
	}
	if ps.Class() != "spare" {
		t.Fatal(ps.Class())
	}
	w := mreq("a")
	w.Deadline = clk.Now().Add(300 * time.Millisecond)
	got := make(chan error, 1)
	go func() {
		p, err := c.Admit(ctx, w)
		if p != nil {
			p.Abandon()
		}
		got <- err
	}()
	waitQueued(t, c, "main", 1)
	clk.Advance(time.Second) // main full (R, x), spare busy (S)
	ps.Release()
	if o := status.OutcomeOf(<-got); o.Reason != status.ReasonDeadlineExpired {
		t.Fatalf("w: %v", o.Reason)
	}
	clk.Advance(10 * time.Second)
	if m := c.Mode(); m != admission.ModeDegraded {
		t.Errorf("W waited 1 s with no slot anywhere (main full, spare busy); drop booked as the tenant's: mode %v", m)
	}
}

// No tenants, every stage on. A waiter B is queued (its deadline reachable
// at arrival). A2 ends after 200 ms, faster than the learned mean (280 ms):
// with what the controller learns from that release, B finishes by t0+714 ms,
// within its t0+720 ms deadline, and pump starts it. A version of
// releaseLocked dropped expired waiters before it learned from the release,
// with the stale estimate (t0+450+280 = 730 > 720), refusing B though it
// would finish (found by review). Classes without tenant limits keep the old
// order; those with them learn first.
func TestReleaseLearnsBeforeItDrops(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 2, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}))
	ctx := context.Background()
	// Warm-up: one 1 s request makes mean 280 ms > p95 126.6 ms.
	p, err := c.Admit(ctx, work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	p.Release()
	t0 := clk.Now()
	a1, err := c.Admit(ctx, work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	defer a1.Release()
	clk.Advance(250 * time.Millisecond)
	a2, err := c.Admit(ctx, work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Millisecond)
	b := work("/s.S/M")
	b.Deadline = t0.Add(720 * time.Millisecond)
	got := make(chan error, 1)
	go func() {
		p, err := c.Admit(ctx, b)
		if p != nil {
			p.Abandon()
		}
		got <- err
	}()
	waitQueued(t, c, "w", 1)
	clk.Advance(190 * time.Millisecond) // t0+450: A2 ran 200 ms
	a2.Release()
	if err := <-got; err != nil {
		st, _ := c.Stats().Class("w")
		t.Fatalf("B refused though it finishes by t0+%v (mean now %v): %v (%s)", 450*time.Millisecond+st.ServiceMean,
			st.ServiceMean, err, status.ReasonName(status.OutcomeOf(err).Reason))
	}
}

// Tenant a runs R; its waiter W waits only for R (the class has 3 free
// slots the whole time). R ends late (195 ms): a version of releaseLocked
// judged W with the old estimate (not expired), then R's long service time
// raised the estimate and pump dropped W, now that a ran nothing, as
// overload, and the controller degraded (found by review). W's wait was the
// tenant's alone: the release learns first, then drops W as it stood.
func TestATenantsLateReleaseIsNotOverload(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDegradation(admission.Degradation{Window: 10 * time.Second, MinDecisions: 1, MaxRefusalRatio: 0.1, EnterAfter: 1}))
	r := work("/demo.Main/Do")
	r.Tenant = "a"
	pr, err := c.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	w := r
	w.Deadline = clk.Now().Add(300 * time.Millisecond)
	got := make(chan error, 1)
	go func() {
		p, err := c.Admit(context.Background(), w)
		if p != nil {
			p.Abandon()
		}
		got <- err
	}()
	waitQueued(t, c, "main", 1)
	clk.Advance(195 * time.Millisecond)
	pr.Release()
	if o := status.OutcomeOf(<-got); o.Reason != status.ReasonDeadlineExpired {
		t.Fatalf("w: %v", o.Reason)
	}
	clk.Advance(10 * time.Second)
	if m := c.Mode(); m != admission.ModeNormal {
		t.Errorf("W waited only for its own tenant's request (class had free slots), yet its drop counts as overload: mode %v", m)
	}
}

// TenantQueueWork is checked as tc.work + work > TenantQueueWork, so once
// the class's learned mean exceeds the bound (here from the start; under
// overload service times grow and the learned mean gets there by itself) a
// tenant with nothing queued and nothing running is refused TENANT_LIMIT
// for its one request whenever the class is full. Since 74d2b99
// TENANT_LIMIT counts in no window ("so that a tenant flooding past its own
// limits cannot dilute the refusals that show real overload"): here no
// tenant floods — ten tenants send one request each to a 1-slot class — yet
// every refusal is TENANT_LIMIT, the window sees one healthy start and no
// refusal, and the server stays Normal while refusing 10 of 11 requests for
// lack of capacity. Without TenantQueueWork the same load is QUEUE_FULL
// and degrades.
func TestSingleRequestOverQueueWorkHidesOverload(t *testing.T) {
	for _, qw := range []time.Duration{0, 50 * time.Millisecond} {
		t.Run(fmt.Sprintf("TenantQueueWork=%v", qw), func(t *testing.T) {
			reasons, m := oneRequestPerTenant(t, qw, false)
			if m != admission.ModeDegraded {
				t.Fatalf("1 slot, 11 requests from 11 tenants (one each): %v; mode %v, want DEGRADED", reasons, m)
			}
		})
	}
}

// oneRequestPerTenant runs one healthy request in a 1-slot class (queue 2,
// TenantQueueWork qw, 100 ms of service) and sends ten more, one per
// tenant, without a deadline or (expired) with one already passed, then
// closes the window. It returns their outcomes (a refusal's reason, or
// "queued") and the mode.
func oneRequestPerTenant(t *testing.T, qw time.Duration, expired bool) (map[string]int, admission.Mode) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "main", Slots: 1, QueueItems: 2, TenantQueueWork: qw, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDefaultClass("main"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 5, EnterAfter: 1}))
	p := h.admitted(work("/demo.Main/Do"))
	defer p.Abandon()
	reasons := map[string]int{}
	for i := range 10 {
		r := work("/demo.Main/Do")
		r.Tenant = fmt.Sprintf("t%d", i) // one request per tenant: nothing queued, nothing running
		if expired {
			r.Deadline = h.clk.Now().Add(-time.Millisecond)
		}
		id, e := h.arrive(r)
		if e.Kind == admission.EventRefused {
			reasons[status.ReasonName(status.OutcomeOf(h.take(id).err).Reason)]++
		} else {
			reasons["queued"]++
		}
	}
	h.tick(time.Second)
	return reasons, h.ctrl.Mode()
}

// Requests that arrive with their deadline already passed are "the caller's
// problem and count in no window" (doc.go, README): without TenantQueueWork
// they are refused DEADLINE_EXPIRED and counted in no window. The tenant
// stage runs before the deadline stage, and since 7f5cab0 a TENANT_LIMIT for
// TenantQueueWork of a tenant with nothing waiting in a full class (classFull)
// counts in the window as QUEUE_FULL. So with TenantQueueWork below the
// learned mean, the same already-expired arrivals are refused TENANT_LIMIT
// and counted as overload, and they alone degrade the server. (The
// TenantRunning/no-queue refusal beside it explicitly yields to an
// already-passed deadline; this one does not.)
func TestExpiredArrivalsCountAsClassFull(t *testing.T) {
	for _, qw := range []time.Duration{0, 50 * time.Millisecond} {
		t.Run(fmt.Sprintf("TenantQueueWork=%v", qw), func(t *testing.T) {
			reasons, m := oneRequestPerTenant(t, qw, true)
			if reasons["queued"] > 0 {
				t.Fatalf("an expired request was queued: %v", reasons)
			}
			if m != admission.ModeNormal {
				t.Fatalf("10 requests expired on arrival (%v) beside one healthy start: mode %v, want NORMAL (expired arrivals count in no window)", reasons, m)
			}
		})
	}
}

// A review found that a waiter whose context was canceled (its client went
// away) counted in the degradation window as a decision that was no
// refusal, a healthy one: clients that gave up while waiting diluted the
// refusals of an overloaded window. Here one request runs, two wait and
// two are refused QUEUE_FULL (2 refusals of 3 decisions: overloaded at a
// ratio of 0.5); the two waiters' clients then go away. The window must
// still be overloaded; it was healthy (2 of 5). A window of cancellations
// alone is no overload either.
func TestCancelledWaitersAreNoHealthyDecisions(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 2, ExpectedServiceTime: time.Second}),
		admission.WithDegradation(admission.Degradation{Window: time.Second, EnterAfter: 1, ExitAfter: 1, MinDecisions: 3, MaxRefusalRatio: 0.5}))
	p := h.admitted(work(mainM))
	q1, q2 := h.queued(work(mainM)), h.queued(work(mainM))
	h.refused(work(mainM), status.ReasonQueueFull)
	h.refused(work(mainM), status.ReasonQueueFull)
	h.clk.Advance(100 * time.Millisecond)
	h.cancel(q1)
	h.cancel(q2)
	h.tick(900 * time.Millisecond)
	require.Equal(t, admission.ModeDegraded, h.ctrl.Mode(),
		"2 of 3 decisions were QUEUE_FULL; the clients that gave up waiting made the window look healthy")

	// Window 2: only waiters that leave.
	w1, w2 := h.queued(work(mainM)), h.queued(work(mainM))
	h.cancel(w1)
	h.cancel(w2)
	h.tick(time.Second)
	require.Equal(t, admission.ModeNormal, h.ctrl.Mode(), "clients going away are no overload")
	h.release(p)
}

// A review found that the wait of a request that left the queue unrun,
// because its client went away or its deadline could no longer be met,
// counted nowhere in the degradation windows: MaxQueueAge saw the waiters
// still queued when a window closed and the requests that started, so a
// queue whose every waiter gave up after waiting longer than MaxQueueAge
// never made a window overloaded, though tollgate.queue.oldest_age showed
// its age all along. Here one request runs and one waits 600 ms against a
// MaxQueueAge of 500 ms, then leaves (canceled; dropped by its deadline);
// the window must be overloaded.
func TestLeftWaitersWaitCountsAgainstMaxQueueAge(t *testing.T) {
	for _, leave := range []string{"canceled", "expired"} {
		t.Run(leave, func(t *testing.T) {
			h := newHarness(t,
				admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 2, ExpectedServiceTime: 100 * time.Millisecond}),
				admission.WithDegradation(admission.Degradation{Window: time.Second, MaxQueueAge: 500 * time.Millisecond, MaxRefusalRatio: -1}))
			p := h.admitted(work(mainM))
			r := work(mainM)
			if leave == "expired" {
				r.Deadline = h.clk.Now().Add(650 * time.Millisecond)
			}
			q := h.queued(r)
			h.clk.Advance(600 * time.Millisecond)
			if leave == "canceled" {
				h.cancel(q)
			} else {
				h.arrive(work(mainM)) // drops q (it can no longer finish) and queues
				require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(h.take(q).err).Reason)
			}
			h.tick(400 * time.Millisecond)
			require.Equal(t, admission.ModeDegraded, h.ctrl.Mode(),
				"a request waited 600 ms against a MaxQueueAge of 500 ms in this window, then left the queue (%s)", leave)
			h.release(p)
		})
	}
}

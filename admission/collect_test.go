package admission_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/tap"
)

// gaugeOf returns the value of the float gauge name for class, from ms.
func gaugeOf(t *testing.T, ms map[string]metricdata.Metrics, name, class string) float64 {
	t.Helper()
	for _, dp := range ms[name].Data.(metricdata.Gauge[float64]).DataPoints {
		if attrs(dp.Attributes)["class"] == class {
			return dp.Value
		}
	}
	t.Fatalf("%s: no data point for class %q", name, class)
	return 0
}

// virtualWaiter builds a real-clock controller driven on virtual time t0
// (AdmitAt, 2020) with opts: class "work" (one slot, 1 s expected) held by
// p with a second request waiting, and class "other" (one slot, methods
// "/demo.Other/"). cancel ends the waiter's wait, whose Admit returns on
// waited.
func virtualWaiter(t *testing.T, opts ...admission.Option) (c *admission.Controller, p *admission.Permit, t0 time.Time, cancel context.CancelFunc, waited chan error) {
	t.Helper()
	c, err := admission.New(append(opts,
		admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second},
			admission.Class{Name: "other", Slots: 1}),
		admission.WithDefaultClass("work"), admission.WithMethods("other", "/demo.Other/"))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	t0 = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	p, err = c.AdmitAt(context.Background(), work("/demo.W/Do"), t0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	waited = make(chan error, 1)
	go func() { _, err := c.AdmitAt(ctx, work("/demo.W/Do"), t0); waited <- err }()
	for {
		if s, _ := c.StatsAt(t0).Class("work"); s.Queued == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return c, p, t0, cancel, waited
}

// Found by review: the metrics callback brought the controller up to date
// at maxTime(wall clock, latest time seen) before observing. A simulation
// that drives a real-clock controller on a virtual clock (AdmitAt, here in
// 2020) had its state moved to the wall clock by every collection: an
// override set for an hour of virtual time expired at the first collect
// (and the frozen class admitted again), the degradation windows up to the
// wall clock closed, and oldest_age reported years of wait. Collecting
// metrics is an observation: it must change nothing.
func TestCollectDoesNotMoveAVirtualClock(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c, p, t0, cancel, waited := virtualWaiter(t, admission.WithMeterProvider(mp))
	_, err := c.SetOverrideAt(context.Background(), admission.Override{
		Actor: "test", Reason: "freeze for an hour of virtual time", Class: "other", Freeze: true, TTL: time.Hour,
	}, t0.Add(2*time.Second))
	require.NoError(t, err)

	ms := collect(t, reader)

	_, err = c.AdmitAt(context.Background(), work("/demo.Other/Do"), t0.Add(3*time.Second))
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason,
		"the class is frozen until t0+2s+1h; a collect must not have expired the override")
	require.Len(t, c.OverridesAt(t0.Add(3*time.Second)), 1)
	require.InDelta(t, 2.0, gaugeOf(t, ms, "tollgate.queue.oldest_age", "work"), 1e-9,
		"the waiter has waited 2 s of the controller's time, the latest it was given")

	cancel()
	<-waited
	p.ReleaseAt(t0.Add(4 * time.Second))
}

// Found by review: on a test clock (WithClock) the metrics callback ran the
// controller's time-driven changes at the collection's time: here the
// expiry of an override that lowered the slots started the waiter at the
// collect, 5 s before the release that would otherwise have started it. The
// same operations with and without a collection must give the same outcome.
func TestCollectDoesNotChangeTheOutcomeOnATestClock(t *testing.T) {
	run := func(collectInBetween bool) (startDelay float64) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		defer func() { _ = mp.Shutdown(context.Background()) }()
		h := newHarness(t, admission.WithMeterProvider(mp),
			admission.WithClasses(admission.Class{Name: "a", Slots: 2, QueueItems: 2, ExpectedServiceTime: time.Second}))
		_, err := h.ctrl.SetOverride(context.Background(), admission.Override{
			Actor: "test", Reason: "one slot for 10 s", Class: "a", Slots: 1, TTL: 10 * time.Second,
		})
		require.NoError(t, err)
		p := h.admitted(admission.Request{Method: heavyM, Size: -1})
		q := h.queued(admission.Request{Method: heavyM, Size: -1})
		h.clk.Advance(10 * time.Second) // the override has expired: nothing has looked yet
		if collectInBetween {
			collect(t, reader)
		}
		h.clk.Advance(5 * time.Second)
		h.release(p) // brings the controller up to date: the waiter starts now
		r := h.take(q)
		require.NoError(t, r.err)
		h.release(r.permit)
		delay := collect(t, reader)["tollgate.task.start_delay"].Data.(metricdata.Histogram[float64])
		var sum float64
		for _, dp := range delay.DataPoints {
			sum += dp.Sum
		}
		return sum
	}
	without := run(false)
	require.InDelta(t, 15.0, without, 1e-9, "the waiter starts at the release, 15 s after it arrived")
	require.InDelta(t, without, run(true), 1e-9, "a collect in between changed when the waiter started")
}

// The mode gauge a collection observes (peekMode) is the mode that
// bringing the controller up to date at the same instant gives, and the
// collection changes nothing the next call sees (a guard of peekMode,
// which works the mode out on the live state and puts it back).
func TestCollectedModeIsTheModeNow(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		clk := newClock()
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		var events []admission.Event
		c, err := admission.New(admission.WithClock(clk.Now), admission.WithMeterProvider(mp),
			admission.WithObserver(func(e admission.Event) { events = append(events, e) }),
			admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 2, EnterAfter: 1 + rng.IntN(2), ExitAfter: 1 + rng.IntN(3)}),
			admission.WithClasses(admission.Class{Name: "a", Slots: 2, ExpectedServiceTime: time.Second},
				admission.Class{Name: "opt", Slots: 3, Optional: true}),
			admission.WithDefaultClass("a"), admission.WithMethods("opt", "/demo.Opt/"))
		require.NoError(t, err)
		var held []*admission.Permit
		for step := 0; step < 200; step++ {
			switch k := rng.IntN(10); {
			case k < 4:
				m := "/demo.W/Do"
				if rng.IntN(2) == 0 {
					m = "/demo.Opt/Do"
				}
				if p, err := c.Admit(context.Background(), work(m)); err == nil {
					held = append(held, p)
				}
			case k < 6 && len(held) > 0:
				i := rng.IntN(len(held))
				held[i].Release()
				held = append(held[:i], held[i+1:]...)
			case k == 6:
				_, _ = c.SetOverride(context.Background(), admission.Override{Actor: "t", Reason: "r",
					Mode: admission.Mode(1 + rng.IntN(3)), TTL: time.Duration(1+rng.IntN(3000)) * time.Millisecond})
			default:
				clk.Advance(time.Duration(rng.IntN(2500)) * time.Millisecond)
			}
			if rng.IntN(3) == 0 {
				before := len(events)
				var rm metricdata.ResourceMetrics
				require.NoError(t, reader.Collect(context.Background(), &rm))
				var peeked int64 = -1
				for _, sm := range rm.ScopeMetrics {
					for _, m := range sm.Metrics {
						if m.Name == "tollgate.admission.mode" {
							peeked = m.Data.(metricdata.Gauge[int64]).DataPoints[0].Value
						}
					}
				}
				require.Equal(t, before, len(events), "seed %d step %d: a collection emitted events", seed, step)
				require.Equal(t, int64(c.Mode()), peeked, "seed %d step %d", seed, step)
			}
		}
		for _, p := range held {
			p.Release()
		}
		require.NoError(t, c.Close())
		require.NoError(t, mp.Shutdown(context.Background()))
	}
}

// Collections race admits, releases, the tap and overrides on the
// real clock, with degradation windows closing all the while.
func TestCollectRacesAdmits(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	c, err := admission.New(admission.WithMeterProvider(mp),
		admission.WithDegradation(admission.Degradation{Window: 2 * time.Millisecond, MinDecisions: 2, MaxQueueAge: 3 * time.Millisecond}),
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 2},
			admission.Class{Name: "opt", Slots: 2, QueueItems: 2, Optional: true}),
		admission.WithDefaultClass("a"), admission.WithMethods("opt", "/demo.Opt/"))
	require.NoError(t, err)
	defer c.Close()
	stop := time.Now().Add(300 * time.Millisecond)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := "/demo.W/Do"
			if g%2 == 1 {
				m = "/demo.Opt/Do"
			}
			for time.Now().Before(stop) {
				_, _ = c.TapHandle(context.Background(), &tap.Info{FullMethodName: m})
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Millisecond)
				if p, err := c.Admit(ctx, admission.Request{Method: m, Size: -1, Deadline: time.Now().Add(4 * time.Millisecond)}); err == nil {
					time.Sleep(time.Millisecond)
					p.Release()
				}
				cancel()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(stop) {
			var rm metricdata.ResourceMetrics
			_ = reader.Collect(context.Background(), &rm)
			_, _ = c.SetOverride(context.Background(), admission.Override{Actor: "t", Reason: "r", Mode: admission.ModeDegraded, TTL: time.Millisecond})
		}
	}()
	wg.Wait()
}

package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
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
	c, err := admission.New(admission.WithMeterProvider(mp),
		admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second},
			admission.Class{Name: "other", Slots: 1}),
		admission.WithDefaultClass("work"), admission.WithMethods("other", "/demo.Other/"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC) // virtual time
	p, err := c.AdmitAt(context.Background(), work("/demo.W/Do"), t0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { _, err := c.AdmitAt(ctx, work("/demo.W/Do"), t0); waited <- err }()
	for {
		if s, _ := c.StatsAt(t0).Class("work"); s.Queued == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	_, err = c.SetOverrideAt(context.Background(), admission.Override{
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

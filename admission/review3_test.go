package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// A review found that, over a gap in which an override expired, advance
// started the waiter the expiry let start (at the gap's end) before it
// closed the windows after the expiry: those windows no longer saw it
// waiting, and its whole wait, measured to the gap's end, counted in the
// window open at the expiry. The metrics' peek, which starts nothing,
// closed the same windows with the waiter still waiting: the mode gauge
// said Degraded while Mode said Recovering. The waiter starts at the gap's
// end, after the windows that end by then are closed, as a start
// Recovering's step lets happen does (rollWindows).
func TestExpiryStartsItsWaitersAfterTheGapsWindows(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	h := newHarness(t, admission.WithMeterProvider(mp),
		admission.WithClasses(admission.Class{Name: "main", Slots: 2, QueueItems: 4}),
		admission.WithDegradation(admission.Degradation{
			Window: time.Second, EnterAfter: 1, ExitAfter: 100, MinDecisions: 1000, MaxQueueAge: 2 * time.Second,
		}))
	_, err := h.ctrl.SetOverride(context.Background(), admission.Override{Actor: "test", Reason: "one slot", Class: "main", Slots: 1, TTL: time.Second})
	require.NoError(t, err)
	h.drain()
	p := h.admitted(work(mainM))
	w := h.queued(work(mainM)) // the override holds it; it expires at 1s

	h.clk.Advance(10 * time.Second) // nothing looks until now
	gauge := collect(t, reader)["tollgate.admission.mode"].Data.(metricdata.Gauge[int64])
	require.Len(t, gauge.DataPoints, 1)
	peeked := admission.Mode(gauge.DataPoints[0].Value)
	mode := h.ctrl.Mode()
	require.Equal(t, mode, peeked, "the mode gauge predicts Mode")
	require.Equal(t, admission.ModeDegraded, mode,
		"the request waited through the windows ending 2s..10s, past MaxQueueAge")
	h.drain()
	res := h.take(w)
	require.NoError(t, res.err)
	res.permit.Release()
	p.Release()
	h.drain()
}

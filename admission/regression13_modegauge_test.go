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

// The controller degrades, the overload ends and the server goes quiet for
// 10 windows. The tollgate.admission.mode gauge's callback reads c.mode()
// without closing the elapsed windows (or expiring overrides) first, unlike
// Mode and Stats: a scrape reports DEGRADED (2) for as long as no request
// arrives, while Mode() at the same instant reports NORMAL — the exported
// mode is whatever it was at the last call, not the mode now. Same for a
// forced mode whose override has expired.
func TestRegression13ModeGaugeIsCurrent(t *testing.T) {
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

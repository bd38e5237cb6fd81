package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Tenant a's R starts at 0 in class main (4 slots, TenantRunning 1, 100 ms).
// At 50 ms a's Q is held back by a's own limit: decideLocked judges it by
// its tenant's start wait, 50 ms (R's remainder), and Q does start exactly
// 50 ms later, when R ends. But the waiter records as its prediction the
// class's predicted wait, 12.5 ms (R's remainder spread over 4 slots), a
// number nothing was decided on, and tollgate.queue.wait_prediction_error
// ("actual minus predicted wait") reports a 37.5 ms error for a prediction
// that was exact. Tenant-held waits thus show up as systematic
// under-prediction in the metric operators tune the estimator by.
func TestRegression5PredictionErrorOfATenantHeldWaiter(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	h := newHarness(t, admission.WithMeterProvider(mp), admission.WithClasses(
		admission.Class{Name: "main", Slots: 4, QueueItems: 10, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond}))
	a := work("/demo.Main/Do")
	a.Tenant = "a"
	pr := h.admitted(a)
	h.clk.Advance(50 * time.Millisecond)
	q := a
	q.Deadline = h.clk.Now().Add(time.Second)
	id := h.queued(q)
	h.clk.Advance(50 * time.Millisecond)
	h.release(pr)
	r := h.take(id)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.permit.Abandon()
	h.drain()
	ms := collect(t, reader)
	pe := ms["tollgate.queue.wait_prediction_error"].Data.(metricdata.Histogram[float64])
	var sum float64
	var n uint64
	for _, dp := range pe.DataPoints {
		if attrs(dp.Attributes)["class"] == "main" {
			sum += dp.Sum
			n += dp.Count
		}
	}
	if n != 1 {
		t.Fatalf("%d prediction errors recorded, want 1", n)
	}
	if got := time.Duration(sum * float64(time.Second)); got < -time.Millisecond || got > time.Millisecond {
		t.Errorf("Q waited exactly the 50 ms its admission predicted (its tenant's start wait), yet the recorded prediction error is %v", got)
	}
}

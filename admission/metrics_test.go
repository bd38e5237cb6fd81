package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func attrs(set attribute.Set) map[string]string {
	m := map[string]string{}
	for _, kv := range set.ToSlice() {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	h := newHarness(t, admission.WithMeterProvider(mp),
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 1, ExpectedServiceTime: time.Second, TenantQueued: 1}))
	now := h.clk.Now()
	p := h.admitted(admission.Request{Method: heavyM, Tenant: "T", Size: -1, Deadline: now.Add(time.Second)})
	q := h.queued(admission.Request{Method: heavyM, Tenant: "T", Size: -1})
	h.refused(admission.Request{Method: heavyM, Tenant: "T", Size: -1}, status.ReasonTenantLimit)
	h.refused(admission.Request{Method: heavyM, Tenant: "U", Size: -1}, status.ReasonQueueFull)
	h.refused(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(-1)}, status.ReasonDeadlineExpired)

	ms := collect(t, reader)
	work := ms["tollgate.queue.estimated_work"].Data.(metricdata.Gauge[float64])
	for _, dp := range work.DataPoints {
		if attrs(dp.Attributes)["class"] == "a" {
			require.InDelta(t, 1.0, dp.Value, 1e-9, "one queued request of a 1s class")
		}
	}
	h.clk.Advance(2 * time.Second)
	h.release(p) // finishes late: a run-stage deadline miss and a false accept
	r := h.take(q)
	require.NoError(t, r.err)
	h.release(r.permit)

	ms = collect(t, reader)
	dec := ms["tollgate.admission.decisions"].Data.(metricdata.Sum[int64])
	got := map[[3]string]int64{}
	for _, dp := range dec.DataPoints {
		a := attrs(dp.Attributes)
		require.NotContains(t, a, "tenant")
		got[[3]string{a["decision"], a["class"], a["reason"]}] += dp.Value
	}
	require.Equal(t, map[[3]string]int64{
		{"admitted", "a", ""}:                2,
		{"refused", "a", "TENANT_LIMIT"}:     1,
		{"refused", "a", "QUEUE_FULL"}:       1,
		{"refused", "a", "DEADLINE_EXPIRED"}: 1,
	}, got)
	misses := ms["tollgate.deadline.misses"].Data.(metricdata.Sum[int64])
	byStage := map[string]int64{}
	for _, dp := range misses.DataPoints {
		byStage[attrs(dp.Attributes)["stage"]] += dp.Value
	}
	require.Equal(t, map[string]int64{"admission": 1, "run": 1}, byStage)
	delay := ms["tollgate.task.start_delay"].Data.(metricdata.Histogram[float64])
	require.EqualValues(t, 2, delay.DataPoints[0].Count)
	require.InDelta(t, 2.0, delay.DataPoints[0].Sum, 1e-9, "the waiter waited 2s")
	svc := ms["tollgate.task.service_time"].Data.(metricdata.Histogram[float64])
	require.EqualValues(t, 2, svc.DataPoints[0].Count)
	fa := ms["tollgate.admission.false_accepts"].Data.(metricdata.Sum[int64])
	for _, dp := range fa.DataPoints {
		if attrs(dp.Attributes)["class"] == "a" {
			require.EqualValues(t, 1, dp.Value)
		}
	}
	for _, name := range []string{"tollgate.queue.oldest_age", "tollgate.admission.false_rejects", "tollgate.admission.mode", "tollgate.queue.wait_prediction_error"} {
		require.Contains(t, ms, name)
	}
}

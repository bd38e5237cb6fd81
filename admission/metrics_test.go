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
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
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

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestDeadlineMissKeepsTheRequestContext: a request that arrives
// with its deadline passed is refused DEADLINE_EXPIRED and counted twice, in
// tollgate.admission.decisions and in tollgate.deadline.misses{stage=admission}.
// Both are recorded for the same request with the same context at hand; the
// decision keeps the request's trace (an exemplar with its trace ID, the SDK's
// default trace-based filter), the miss must too: it is the one an operator
// follows to the late request's trace.
func TestDeadlineMissKeepsTheRequestContext(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctrl, err := admission.New(admission.WithMeterProvider(mp),
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 1}), admission.WithDefaultClass("a"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })

	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	traceID := span.SpanContext().TraceID()
	_, err = ctrl.Admit(ctx, admission.Request{Method: "/x.S/M", Size: -1, Deadline: time.Now().Add(-time.Second)})
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	exemplarTraced := func(name string) (found, traced bool) {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != name {
					continue
				}
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					found = true
					for _, e := range dp.Exemplars {
						if string(e.TraceID) == string(traceID[:]) {
							traced = true
						}
					}
				}
			}
		}
		return found, traced
	}
	found, traced := exemplarTraced("tollgate.admission.decisions")
	require.True(t, found)
	require.True(t, traced, "the decision keeps the request's trace")
	found, traced = exemplarTraced("tollgate.deadline.misses")
	require.True(t, found)
	require.True(t, traced, "the deadline miss of the same request is recorded without its context (context.Background)")
}

// A review found that a request that waited in the queue and whose context
// was canceled (its client went away) before it started was counted as a
// refusal, tollgate.admission.decisions{decision=refused,reason=UNSPECIFIED},
// and in Stats' Refused as "UNSPECIFIED": the server refused nothing, and
// an operator alerting on refusals saw clients that gave up as refusals of
// an unknown kind. It pins that such a request is a decision of its own,
// decision=cancelled with no reason, counted in Stats' Cancelled, and that
// its wait, which ended in no start, is neither a start delay nor a
// prediction error.
func TestCancelledWaiterIsItsOwnDecision(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	h := newHarness(t, admission.WithMeterProvider(mp),
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}))
	p := h.admitted(work(heavyM))
	q := h.queued(work(heavyM))
	h.clk.Advance(300 * time.Millisecond)
	res := h.cancel(q)
	require.ErrorIs(t, res.err, context.Canceled)
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(res.err).Kind)

	ms := collect(t, reader)
	got := map[[3]string]int64{}
	for _, dp := range ms["tollgate.admission.decisions"].Data.(metricdata.Sum[int64]).DataPoints {
		a := attrs(dp.Attributes)
		got[[3]string{a["decision"], a["class"], a["reason"]}] += dp.Value
	}
	require.Equal(t, map[[3]string]int64{
		{"admitted", "a", ""}:  1,
		{"cancelled", "a", ""}: 1,
	}, got, "a waiter whose client went away is neither admitted nor refused")
	s, _ := h.ctrl.Stats().Class("a")
	require.Empty(t, s.Refused, "nothing was refused")
	require.EqualValues(t, 1, s.Cancelled)
	require.EqualValues(t, 1, s.Admitted)
	delay := ms["tollgate.task.start_delay"].Data.(metricdata.Histogram[float64])
	require.EqualValues(t, 1, delay.DataPoints[0].Count, "only the request that started has a start delay")
	if pe, ok := ms["tollgate.queue.wait_prediction_error"]; ok {
		for _, dp := range pe.Data.(metricdata.Histogram[float64]).DataPoints {
			require.Zero(t, dp.Count, "a wait cut short by the caller is no measure of the prediction")
		}
	}
	h.release(p)
}

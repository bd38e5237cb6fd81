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

// pastDeadlineCtx is a context whose deadline has passed but which reports
// context.Canceled: one canceled in the instant between its deadline and
// its timer, or a gRPC server's whose client's RST_STREAM (sent when the
// client's deadline passed) came before the server's own timer fired.
type pastDeadlineCtx struct {
	context.Context
	deadline time.Time
}

func (c pastDeadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// A review found that a waiter whose context ended was told apart as
// cancelled or DEADLINE_EXPIRED by ctx.Err() alone: a context canceled
// once its deadline had passed (a gRPC client's RST_STREAM at its deadline
// often reaches the server before the server's timer for the same
// deadline fires), one canceled with context.DeadlineExceeded as its cause,
// or one canceled after the request's own deadline had passed, counted as
// a client that went away — no refusal, in no window — though the queue
// held it past its deadline. It pins that each is a DEADLINE_EXPIRED
// refusal, and that a plain cancel before any deadline stays cancelled.
func TestWaiterCanceledPastItsDeadlineIsDeadlineExpired(t *testing.T) {
	for _, c := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		req     admission.Request
		advance time.Duration // the controller's clock, before the cancel
		want    status.Reason
	}{
		{"ctx deadline passed", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			return pastDeadlineCtx{ctx, time.Now().Add(-time.Millisecond)}, cancel
		}, work(heavyM), 0, status.ReasonDeadlineExpired},
		{"cause DeadlineExceeded", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancelCause(context.Background())
			return ctx, func() { cancel(fmt.Errorf("upstream: %w", context.DeadlineExceeded)) }
		}, work(heavyM), 0, status.ReasonDeadlineExpired},
		{"request deadline passed", func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}, admission.Request{Method: heavyM, Size: -1, Deadline: epoch.Add(3 * time.Second)}, 5 * time.Second, status.ReasonDeadlineExpired},
		{"ctx deadline ahead", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			return pastDeadlineCtx{ctx, time.Now().Add(time.Hour)}, cancel
		}, work(heavyM), 0, status.ReasonUnspecified},
	} {
		t.Run(c.name, func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
			// Without the dequeue stage, a waiter past its deadline is
			// dropped by nothing but its context.
			h := newHarness(t, admission.WithMeterProvider(mp), admission.WithStages(admission.AllStages&^admission.StageDequeue),
				admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}))
			p := h.admitted(work(heavyM))
			ctx, cancel := c.ctx()
			id, e := h.arriveCtx(ctx, cancel, c.req)
			require.Equal(t, admission.EventQueued, e.Kind)
			if c.advance > 0 {
				h.tick(c.advance)
			}
			res := h.cancel(id)
			require.Equal(t, c.want, status.OutcomeOf(res.err).Reason, "%v", res.err)
			s, _ := h.ctrl.Stats().Class("a")
			got := map[string]int64{}
			for _, dp := range collect(t, reader)["tollgate.admission.decisions"].Data.(metricdata.Sum[int64]).DataPoints {
				a := attrs(dp.Attributes)
				got[a["decision"]+":"+a["reason"]] += dp.Value
			}
			if c.want == status.ReasonDeadlineExpired {
				require.Zero(t, s.Cancelled)
				require.EqualValues(t, map[string]uint64{"DEADLINE_EXPIRED": 1}, s.Refused)
				require.Equal(t, map[string]int64{"admitted:": 1, "refused:DEADLINE_EXPIRED": 1}, got)
			} else {
				require.EqualValues(t, 1, s.Cancelled)
				require.Empty(t, s.Refused)
				require.Equal(t, map[string]int64{"admitted:": 1, "cancelled:": 1}, got)
			}
			h.release(p)
		})
	}
}

// A review found that a request whose context had already ended when Admit
// looked at it was refused UNSPECIFIED before it was classified and counted
// nowhere — not in tollgate.admission.decisions, not in Stats — while the
// same request a moment later, ended in the queue, counted as cancelled or
// DEADLINE_EXPIRED: a burst of requests whose clients gave up while the
// server was busy elsewhere (in the tap, the store, other interceptors)
// left no trace. It pins that such a request is counted in its class as
// it would have been had it ended while it waited: canceled, as cancelled;
// past its deadline, as DEADLINE_EXPIRED, a deadline miss at the admission
// stage; and, like any arrival after its deadline, in no degradation window.
func TestContextEndedBeforeLookingIsCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	clk := newClock()
	ctrl, err := admission.New(admission.WithClock(clk.Now), admission.WithMeterProvider(mp),
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 1, MaxRefusalRatio: 0.5}))
	require.NoError(t, err)
	defer ctrl.Close()
	p, err := ctrl.Admit(context.Background(), work(heavyM))
	require.NoError(t, err)

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	_, d, err := ctrl.AdmitDecision(canceled, work(heavyM))
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, status.ReasonUnspecified, status.OutcomeOf(err).Reason)
	require.Equal(t, admission.Decision{Class: "a"}, d)

	for range 3 {
		expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		_, _, err = ctrl.AdmitDecision(expired, work(heavyM))
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason)
		require.Equal(t, "a", status.OutcomeOf(err).Detail.GetWorkloadClass())
	}

	s, _ := ctrl.Stats().Class("a")
	require.EqualValues(t, 1, s.Cancelled)
	require.EqualValues(t, map[string]uint64{"DEADLINE_EXPIRED": 3}, s.Refused)
	ms := collect(t, reader)
	got := map[string]int64{}
	for _, dp := range ms["tollgate.admission.decisions"].Data.(metricdata.Sum[int64]).DataPoints {
		a := attrs(dp.Attributes)
		got[a["decision"]+":"+a["reason"]] += dp.Value
	}
	require.Equal(t, map[string]int64{"admitted:": 1, "cancelled:": 1, "refused:DEADLINE_EXPIRED": 3}, got)
	misses := map[string]int64{}
	if m, ok := ms["tollgate.deadline.misses"]; ok {
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			misses[attrs(dp.Attributes)["stage"]] += dp.Value
		}
	}
	require.Equal(t, map[string]int64{"admission": 3}, misses)

	// 3 refusals of 4 decisions would make the window overloaded, were
	// they the queue's: they are the callers'.
	clk.Advance(time.Second)
	require.Equal(t, admission.ModeNormal, ctrl.Mode())
	p.Release()
}

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

// ReleaseMissCounted ends a permit as Release does — the service time is
// learned and recorded, a late finish is a false accept — but counts no
// run miss: its caller counted the request's miss under a stage of its own
// (tollgate's interceptor, a late try on arrival). Release of a like permit
// counts one; a second end of either permit does nothing.
func TestR15ReleaseMissCountedCountsNoRunMiss(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 2}),
		admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	r := work("/demo.W/Do")
	r.Deadline = t0.Add(100 * time.Millisecond)
	counted, err := c.AdmitAt(context.Background(), r, t0)
	require.NoError(t, err)
	plain, err := c.AdmitAt(context.Background(), r, t0)
	require.NoError(t, err)
	late := t0.Add(200 * time.Millisecond) // both finish past their deadline
	counted.ReleaseMissCountedAt(late)
	counted.ReleaseAt(late) // ended already: nothing
	plain.ReleaseAt(late)
	plain.ReleaseMissCountedAt(late)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	misses := map[string]int64{}
	var served uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == "tollgate.deadline.misses" {
					for _, dp := range d.DataPoints {
						v, _ := dp.Attributes.Value("stage")
						misses[v.AsString()] += dp.Value
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name == "tollgate.task.service_time" {
					for _, dp := range d.DataPoints {
						served += dp.Count
					}
				}
			}
		}
	}
	require.Equal(t, map[string]int64{"run": 1}, misses, "only the plain Release counts a run miss")
	require.Equal(t, uint64(2), served, "both permits' times are service times")
	st := c.StatsAt(late)
	for _, cl := range st.Classes {
		if cl.Name == "work" {
			require.Equal(t, uint64(2), cl.FalseAccepts, "both finished late")
			require.Zero(t, cl.Running)
			return
		}
	}
	t.Fatal("no class work")
}

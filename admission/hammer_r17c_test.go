package admission

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// hammeredController is the controller the hammer tests drive: classes,
// classified by their names (Request.Method is the class), with
// degradation deg, its metrics read by reader. violation returns the first
// invariant violation the controller reported, or nil.
func hammeredController(t *testing.T, deg Degradation, classes ...Class) (c *Controller, reader *sdkmetric.ManualReader, violation func() error) {
	t.Helper()
	reader = sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	var vmu sync.Mutex
	var viol error
	c, err := New(WithClasses(classes...),
		WithClassifier(func(_ context.Context, r Request) string { return r.Method }),
		WithMeterProvider(mp),
		WithDegradation(deg),
		WithInvariantCheck(func(err error) {
			if err != nil {
				vmu.Lock()
				if viol == nil {
					viol = err
				}
				vmu.Unlock()
			}
		}))
	require.NoError(t, err)
	return c, reader, func() error {
		vmu.Lock()
		defer vmu.Unlock()
		return viol
	}
}

// hammerCounts collects reader: the decisions counted in
// tollgate.admission.decisions, those of them cancelled, and the deadline
// misses of the stages before a request runs (admission, dequeue).
func hammerCounts(t *testing.T, reader *sdkmetric.ManualReader) (decisions, cancelled, misses int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			d, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, dp := range d.DataPoints {
				switch m.Name {
				case "tollgate.admission.decisions":
					decisions += dp.Value
					if v, _ := dp.Attributes.Value("decision"); v.AsString() == "cancelled" {
						cancelled += dp.Value
					}
				case "tollgate.deadline.misses":
					if v, _ := dp.Attributes.Value("stage"); v.AsString() != "run" {
						misses += dp.Value
					}
				}
			}
		}
	}
	return decisions, cancelled, misses
}

// requireDrained checks that no class of st runs, waits or holds a slot,
// and returns the decisions the classes counted (admitted, cancelled,
// refused) and the cancelled among them.
func requireDrained(t *testing.T, st Stats) (total, cancelled uint64) {
	t.Helper()
	for _, cl := range st.Classes {
		require.Zero(t, cl.Running, cl.Name)
		require.Zero(t, cl.Queued, cl.Name)
		require.Zero(t, cl.UsedSlots, cl.Name)
		total += cl.Admitted + cl.Cancelled
		cancelled += cl.Cancelled
		for _, k := range cl.Refused {
			total += k
		}
	}
	return total, cancelled
}

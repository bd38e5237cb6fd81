package admission_test

import (
	"context"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Review r17 (OpenTelemetry signals, real SDK): the tests below pin what
// the admission controller's metrics and span events must say for an
// operator to use them.

// bucketOf is the index of the histogram bucket that v falls in: bucket i
// holds (bounds[i-1], bounds[i]].
func bucketOf(bounds []float64, v float64) int {
	for i, b := range bounds {
		if v <= b {
			return i
		}
	}
	return len(bounds)
}

// histogramPoints returns the data points of the histogram name.
func histogramPoints(t *testing.T, ms map[string]metricdata.Metrics, name string) []metricdata.HistogramDataPoint[float64] {
	t.Helper()
	m, ok := ms[name]
	require.True(t, ok, "no %s", name)
	return m.Data.(metricdata.Histogram[float64]).DataPoints
}

// waitTwice runs, in class a (1 slot, 100 ms expected), a request that
// holds the slot 30 ms with a waiter behind it, then that waiter holding
// it 300 ms with another waiter behind it. It returns the waits predicted
// for the two waiters as they arrived (Stats' PredictedWait, the wait the
// deadline stage predicts for an arrival then).
func waitTwice(t *testing.T, h *harness) (p1, p2 time.Duration) {
	t.Helper()
	p := h.admitted(work(heavyM))
	s, _ := h.ctrl.Stats().Class("a")
	p1 = s.PredictedWait
	q1 := h.queued(work(heavyM))
	h.clk.Advance(30 * time.Millisecond)
	h.release(p)
	r1 := h.take(q1)
	require.NoError(t, r1.err)
	s, _ = h.ctrl.Stats().Class("a")
	p2 = s.PredictedWait
	q2 := h.queued(work(heavyM))
	h.clk.Advance(300 * time.Millisecond)
	h.release(r1.permit)
	r2 := h.take(q2)
	require.NoError(t, r2.err)
	h.clk.Advance(300 * time.Millisecond)
	h.release(r2.permit)
	return p1, p2
}

// The duration histograms were created with the unit "s" and no bucket
// boundaries, so the SDK's defaults (0, 5, 10, 25, … 10000) applied: every
// request latency under 5 s fell in one bucket, and no percentile of a
// start delay, service time or prediction error could be told from
// another. It pins boundaries that tell 30 ms from 300 ms, and that the
// values recorded land in their own buckets.
func TestDurationHistogramsHaveLatencyBuckets(t *testing.T) {
	h, reader := newMeteredHarness(t, admission.WithClasses(admission.Class{
		Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}))
	waitTwice(t, h)
	ms := collect(t, reader)
	for _, name := range []string{"tollgate.task.start_delay", "tollgate.task.service_time", "tollgate.queue.wait_prediction_error"} {
		dps := histogramPoints(t, ms, name)
		require.NotEmpty(t, dps, name)
		for _, dp := range dps {
			require.NotEqual(t, bucketOf(dp.Bounds, 0.030), bucketOf(dp.Bounds, 0.300),
				"%s: 30 ms and 300 ms share a bucket of %v", name, dp.Bounds)
			require.NotEqual(t, bucketOf(dp.Bounds, 0.001), bucketOf(dp.Bounds, 0.010),
				"%s: 1 ms and 10 ms share a bucket of %v", name, dp.Bounds)
			require.NotEqual(t, bucketOf(dp.Bounds, 10), bucketOf(dp.Bounds, 30),
				"%s: 10 s and 30 s share a bucket of %v", name, dp.Bounds)
		}
	}
	for _, name := range []string{"tollgate.task.start_delay", "tollgate.task.service_time"} {
		dp := histogramPoints(t, ms, name)[0]
		require.Len(t, dp.BucketCounts, len(dp.Bounds)+1)
		require.EqualValues(t, 1, dp.BucketCounts[bucketOf(dp.Bounds, 0.030)], "%s: the one 30 ms value", name)
		require.GreaterOrEqual(t, dp.BucketCounts[bucketOf(dp.Bounds, 0.300)], uint64(1), "%s: a 300 ms value", name)
	}
}

// tollgate.queue.wait_prediction_error recorded actual − predicted wait,
// negative for every waiter that started sooner than predicted: a
// histogram of negative values puts them all in its lowest bucket, and
// Prometheus gets a negative _sum. It pins the absolute error, with
// direction "over" (waited less than predicted) or "under" (waited more).
func TestWaitPredictionErrorIsAbsoluteWithDirection(t *testing.T) {
	h, reader := newMeteredHarness(t, admission.WithClasses(admission.Class{
		Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}))
	p1, p2 := waitTwice(t, h)
	require.Greater(t, p1, 30*time.Millisecond, "the first waiter was told of a longer wait than the 30 ms it had")
	require.Less(t, p2, 300*time.Millisecond, "the second was told of a shorter wait than the 300 ms it had")

	got := map[string]metricdata.HistogramDataPoint[float64]{}
	for _, dp := range histogramPoints(t, collect(t, reader), "tollgate.queue.wait_prediction_error") {
		a := attrs(dp.Attributes)
		require.Equal(t, "a", a["class"])
		require.Len(t, a, 2, "class and direction: %v", a)
		got[a["direction"]] = dp
		require.GreaterOrEqual(t, dp.Sum, 0.0, "a histogram of durations takes no negative value")
		mn, ok := dp.Min.Value()
		require.True(t, ok)
		require.GreaterOrEqual(t, mn, 0.0)
	}
	require.ElementsMatch(t, []string{"over", "under"}, keys(got))
	require.EqualValues(t, 1, got["over"].Count)
	require.InDelta(t, (p1 - 30*time.Millisecond).Seconds(), got["over"].Sum, 1e-9)
	require.EqualValues(t, 1, got["under"].Count)
	require.InDelta(t, (300*time.Millisecond - p2).Seconds(), got["under"].Sum, 1e-9)
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// modeTransitions is the tollgate.admission.mode_transitions counter by
// "previous→mode".
func modeTransitions(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	m, ok := collect(t, reader)["tollgate.admission.mode_transitions"]
	if !ok {
		return got
	}
	sum := m.Data.(metricdata.Sum[int64])
	require.True(t, sum.IsMonotonic)
	for _, dp := range sum.DataPoints {
		a := attrs(dp.Attributes)
		require.Len(t, a, 2, "mode and previous: %v", a)
		got[a["previous"]+"→"+a["mode"]] += dp.Value
	}
	return got
}

// Mode changes were only the tollgate.admission.mode gauge and a short
// root span each: a Degraded spell between two scrapes, or one whose span
// the sampler dropped, left no trace. It pins a counter of the state
// machine's transitions by the mode entered and the one left, which
// agrees with Stats().Transitions, and that collecting (which peeks at the
// mode without changing it) counts nothing twice.
func TestModeTransitionsAreCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	h := degradeHarness(t, 1, 2, admission.WithMeterProvider(mp))
	require.Equal(t, admission.ModeDegraded, h.window(true))
	h.clk.Advance(time.Second) // a healthy window ends: Recovering, seen by no call yet
	require.Empty(t, modeTransitions(t, reader)["DEGRADED→RECOVERING"], "a collection only peeks")
	require.Equal(t, admission.ModeRecovering, h.ctrl.Mode())
	h.drain()
	h.tick(time.Second) // Normal
	require.Equal(t, admission.ModeNormal, h.ctrl.Mode())
	for range 2 { // a collection changes nothing: the same counts twice
		require.Equal(t, map[string]int64{
			"NORMAL→DEGRADED":     1,
			"DEGRADED→RECOVERING": 1,
			"RECOVERING→NORMAL":   1,
		}, modeTransitions(t, reader))
	}
	require.Equal(t, 3, h.ctrl.Stats().Transitions)
}

// upDown returns the class's value of the observed up-down counter name,
// and whether it had one.
func upDown(ms map[string]metricdata.Metrics, name, class string) (int64, bool) {
	m, ok := ms[name]
	if !ok {
		return 0, false
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok || sum.IsMonotonic {
		return 0, false
	}
	for _, dp := range sum.DataPoints {
		if attrs(dp.Attributes)["class"] == class {
			return dp.Value, true
		}
	}
	return 0, false
}

// Controller.Stats() had the requests running, the slots in use and the
// requests waiting per class; no instrument exported them. It pins three
// observed up-down counters per class that read what Stats reads (a
// borrower's request runs in its class on the lender's slot), and that
// Close unregisters them.
func TestRunningSlotsAndQueuedAreObserved(t *testing.T) {
	h, reader := newMeteredHarness(t, lendAndBorrowOptions(2)...)
	p := h.longBorrowedStream()   // b's stream on one of opt's slots
	o := h.admitted(work(mainM))  // opt's other slot
	o2 := h.admitted(work(mainM)) // the lender's idle one
	h.queued(work(mainM))
	st := h.ctrl.Stats()
	ms := collect(t, reader)
	for _, cs := range st.Classes {
		for name, want := range map[string]int{
			"tollgate.admission.running":    cs.Running,
			"tollgate.admission.slots_used": cs.UsedSlots,
			"tollgate.queue.length":         cs.Queued,
		} {
			got, ok := upDown(ms, name, cs.Name)
			require.True(t, ok, "%s{class=%s}", name, cs.Name)
			require.EqualValues(t, want, got, "%s{class=%s}", name, cs.Name)
		}
	}
	var borrowed, waiting bool
	for _, cs := range st.Classes {
		borrowed = borrowed || cs.Running != cs.UsedSlots
		waiting = waiting || cs.Queued > 0
	}
	require.True(t, borrowed, "a borrowed slot counts in its lender's slots_used, in its borrower's running: %+v", st.Classes)
	require.True(t, waiting)
	require.NoError(t, h.ctrl.Close())
	h.drain()
	ms = collect(t, reader)
	for _, name := range []string{"tollgate.admission.running", "tollgate.admission.slots_used", "tollgate.queue.length"} {
		_, ok := upDown(ms, name, "opt")
		require.False(t, ok, "%s observed after Close", name)
	}
	o.Release()
	o2.Release()
	p.Release()
}

// overrideEvents returns the attributes of the tollgate.admission.override
// events of the spans rec ended, by action.
func overrideEvents(rec *tracetest.SpanRecorder) map[string][]map[string]string {
	out := map[string][]map[string]string{}
	for _, sp := range rec.Ended() {
		for _, ev := range sp.Events() {
			if ev.Name != "tollgate.admission.override" {
				continue
			}
			a := attrs(attribute.NewSet(ev.Attributes...))
			out[a["action"]] = append(out[a["action"]], a)
		}
	}
	return out
}

// The tollgate.admission.override events carried every field of Override,
// set or not: a freeze read "slots=0 queue_items=0 mode=UNSET", which says
// nothing the override did. It pins the attributes each event carries:
// action, id, actor, reason and expires always; tollgate.class, freeze,
// slots, queue_items and mode only when the override sets them.
func TestOverrideEventsCarryWhatTheOverrideSets(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h := newHarness(t, admission.WithTracerProvider(tp),
		admission.WithClasses(admission.Class{Name: "opt", Slots: 3, QueueItems: 2}))
	always := []string{"action", "id", "actor", "reason", "expires"}
	for _, c := range []struct {
		o    admission.Override
		more map[string]string
	}{
		{admission.Override{Class: "opt", Freeze: true}, map[string]string{"tollgate.class": "opt", "freeze": "true"}},
		{admission.Override{Class: "opt", Slots: 2}, map[string]string{"tollgate.class": "opt", "slots": "2"}},
		{admission.Override{Class: "opt", QueueItems: 1, Slots: 1}, map[string]string{"tollgate.class": "opt", "queue_items": "1", "slots": "1"}},
		{admission.Override{Mode: admission.ModeDegraded}, map[string]string{"mode": "DEGRADED"}},
	} {
		o := c.o
		o.Actor, o.Reason, o.TTL = "alice", "drill", time.Second
		id, err := h.ctrl.SetOverride(context.Background(), o)
		require.NoError(t, err)
		h.drain()
		require.True(t, h.ctrl.ClearOverride(context.Background(), id))
		h.drain()
		for _, action := range []string{"set", "clear"} {
			evs := overrideEvents(rec)[action]
			require.NotEmpty(t, evs)
			a := evs[len(evs)-1]
			want := slices.Clone(always)
			for k, v := range c.more {
				want = append(want, k)
				require.Equal(t, v, a[k], "%s of %+v", k, c.o)
			}
			require.ElementsMatch(t, want, keys(a), "%s of %+v: %v", action, c.o, a)
		}
	}
}

// exportedNames parses the package's non-test files and returns its doc
// comments (package, declarations, methods, fields) and its exported
// names.
func exportedNames(t *testing.T) (docs []string, names map[string]bool) {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	pkg, err := doc.NewFromFiles(fset, files, "github.com/tollgate-go/tollgate/admission")
	require.NoError(t, err)
	names = map[string]bool{}
	docs = append(docs, pkg.Doc)
	addFuncs := func(fs []*doc.Func) {
		for _, f := range fs {
			names[f.Name] = true
			docs = append(docs, f.Doc)
		}
	}
	addValues := func(vs []*doc.Value) {
		for _, v := range vs {
			names = addAll(names, v.Names)
			docs = append(docs, v.Doc)
			for _, s := range v.Decl.Specs {
				if vs, ok := s.(*ast.ValueSpec); ok && vs.Doc != nil {
					docs = append(docs, vs.Doc.Text())
				}
			}
		}
	}
	addFuncs(pkg.Funcs)
	addValues(pkg.Consts)
	addValues(pkg.Vars)
	for _, ty := range pkg.Types {
		names[ty.Name] = true
		docs = append(docs, ty.Doc)
		addFuncs(ty.Funcs)
		addFuncs(ty.Methods)
		addValues(ty.Consts)
		addValues(ty.Vars)
		ast.Inspect(ty.Decl, func(n ast.Node) bool {
			if f, ok := n.(*ast.Field); ok && f.Doc != nil {
				docs = append(docs, f.Doc.Text())
			}
			return true
		})
	}
	return docs, names
}

func addAll(m map[string]bool, ns []string) map[string]bool {
	for _, n := range ns {
		m[n] = true
	}
	return m
}

// The go doc of Controller.ClearOverride and Permit.Release said they act
// "on the controller's clock (WithClock's, or the wall clock)": WithClock
// is a test-only option (export_test.go) that no user can call. It pins
// that every option a doc comment names (With…) is one the package
// exports.
func TestDocsNameOnlyExportedOptions(t *testing.T) {
	docs, names := exportedNames(t)
	require.True(t, names["WithMeterProvider"], "the parse found the options")
	opt := regexp.MustCompile(`\bWith[A-Z][A-Za-z]*\b`)
	for _, d := range docs {
		for _, name := range opt.FindAllString(d, -1) {
			require.True(t, names[name], "a doc comment names %s, which the package does not export:\n%s", name, d)
		}
	}
}

// The learned p95 service time started from ExpectedServiceTime and
// climbed by a tenth of the larger estimate per slower sample, so it read
// below the mean for the first samples: seeded with 50 ms, after three
// jobs of 200 ms the mean was 123 ms and the p95 79 ms. A 95th percentile
// under the mean of the same evidence misleads whoever reads Stats. It
// pins that ServiceP95 never reads below ServiceMean while the class
// learns its first samples, and that it still settles on a steady load.
func TestLearnedP95NotBelowMeanWhileLearning(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{
		Name: "a", Slots: 1, ExpectedServiceTime: 50 * time.Millisecond}))
	for i := range 30 {
		p := h.admitted(work(heavyM))
		h.clk.Advance(200 * time.Millisecond)
		h.release(p)
		s, _ := h.ctrl.Stats().Class("a")
		require.GreaterOrEqual(t, s.ServiceP95, s.ServiceMean, "after %d samples of 200 ms: mean %v p95 %v", i+1, s.ServiceMean, s.ServiceP95)
	}
	s, _ := h.ctrl.Stats().Class("a")
	require.InDelta(t, 200*time.Millisecond, s.ServiceP95, float64(5*time.Millisecond))
}

// readmeInstruments parses the README's table of admission instruments:
// rows "| `name` | kind | `unit` or — | attributes | meaning |", the
// attributes' keys in backticks ("none" for none).
func readmeInstruments(t *testing.T) map[string][3]string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	tick := regexp.MustCompile("`([^`]*)`")
	out := map[string][3]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "| `tollgate.") {
			continue
		}
		cols := strings.Split(line, "|")
		require.GreaterOrEqual(t, len(cols), 6, line)
		name := strings.Trim(strings.TrimSpace(cols[1]), "`")
		unit := strings.TrimSpace(cols[3])
		if unit == "—" {
			unit = ""
		} else {
			unit = strings.Trim(unit, "`")
		}
		var ks []string
		for _, m := range tick.FindAllStringSubmatch(cols[4], -1) {
			ks = append(ks, m[1])
		}
		sort.Strings(ks)
		out[name] = [3]string{strings.TrimSpace(cols[2]), unit, strings.Join(ks, ",")}
	}
	return out
}

// kindOf names an aggregation as the README's table does.
func kindOf(t *testing.T, d metricdata.Aggregation) string {
	switch d := d.(type) {
	case metricdata.Sum[int64]:
		if d.IsMonotonic {
			return "counter"
		}
		return "updowncounter"
	case metricdata.Sum[float64]:
		if d.IsMonotonic {
			return "counter"
		}
		return "updowncounter"
	case metricdata.Gauge[int64], metricdata.Gauge[float64]:
		return "gauge"
	case metricdata.Histogram[float64], metricdata.Histogram[int64]:
		return "histogram"
	}
	t.Fatalf("unexpected aggregation %T", d)
	return ""
}

// attrKeys returns the attribute keys of the metric's data points, sorted
// and joined.
func attrKeys(t *testing.T, d metricdata.Aggregation) string {
	set := map[string]bool{}
	add := func(s attribute.Set) {
		for _, kv := range s.ToSlice() {
			set[string(kv.Key)] = true
		}
	}
	switch d := d.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	default:
		t.Fatalf("unexpected aggregation %T", d)
	}
	return strings.Join(keys(set), ",")
}

// The README listed the admission instruments by name in a paragraph,
// without their kinds, units or (for most) attributes, nor the mode
// gauge's encoding. It pins a table row for every instrument the
// controller exports, whose kind, unit and attribute keys are the SDK's.
func TestReadmeTablesEveryAdmissionInstrument(t *testing.T) {
	h, reader := newMeteredHarness(t,
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDegradation(admission.Degradation{Window: time.Second, EnterAfter: 1, ExitAfter: 1, MinDecisions: 2, MaxRefusalRatio: 0.5}))
	p := h.admitted(work(heavyM))
	q := h.queued(work(heavyM))
	for range 3 {
		h.refused(work(heavyM), status.ReasonQueueFull)
	}
	h.refused(admission.Request{Method: heavyM, Size: -1, Deadline: h.clk.Now().Add(-time.Second)}, status.ReasonDeadlineExpired)
	h.clk.Advance(30 * time.Millisecond)
	h.release(p)
	r := h.take(q)
	require.NoError(t, r.err)
	h.release(r.permit)
	h.tick(time.Second)
	require.Equal(t, admission.ModeDegraded, h.ctrl.Mode())
	h.drain()

	table := readmeInstruments(t)
	ms := collect(t, reader)
	require.GreaterOrEqual(t, len(ms), 14, "every instrument has data: %v", keys(ms))
	for name, m := range ms {
		row, ok := table[name]
		require.True(t, ok, "README has no row for %s", name)
		require.Equal(t, kindOf(t, m.Data), row[0], "%s: kind", name)
		require.Equal(t, m.Unit, row[1], "%s: unit", name)
		want := attrKeys(t, m.Data)
		if want == "" {
			want = "none"
			row[2] = strings.TrimSpace(row[2])
			if row[2] == "" {
				row[2] = "none"
			}
		}
		require.Equal(t, want, row[2], "%s: attributes", name)
	}
}

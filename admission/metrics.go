package admission

import (
	"context"
	"time"

	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const scope = "github.com/tollgate-go/tollgate/admission"

// durationBuckets are the bucket boundaries, in seconds, of the duration
// histograms (start delay, service time, wait prediction error): the
// OpenTelemetry semantic conventions' boundaries for request durations
// (5 ms to 10 s), extended down to 0.5 ms and up to 30 s, so that the
// latencies of requests tell apart from a fast handler's to a long wait.
// A view (sdk/metric.NewView) can replace them.
var durationBuckets = []float64{
	0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075,
	0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30,
}

// instruments are the controller's OpenTelemetry instruments (DESIGN.md §5).
// Attribute sets are built once per class and reason, so recording does not
// allocate on our side.
type instruments struct {
	decisions   metric.Int64Counter
	startDelay  metric.Float64Histogram
	serviceTime metric.Float64Histogram
	misses      metric.Int64Counter
	predErr     metric.Float64Histogram
	modeChanges metric.Int64Counter
	reg         metric.Registration
	tracer      trace.Tracer

	missAdmission, missDequeue, missRun []metric.AddOption
	// modeAttrs are the mode transitions' attributes, by the mode entered
	// and the one left.
	modeAttrs map[[2]Mode][]metric.AddOption
}

// classAttrs are a class's prebuilt attribute options.
type classAttrs struct {
	admitted  []metric.AddOption
	cancelled []metric.AddOption
	refused   map[status.Reason][]metric.AddOption
	record    []metric.RecordOption
	observe   []metric.ObserveOption
	// predUnder, predOver and predExact record a wait prediction's error
	// with its class and direction.
	predUnder, predOver, predExact []metric.RecordOption
}

func newInstruments(c *Controller) (*instruments, error) {
	meter := c.cfg.mp.Meter(scope)
	m := &instruments{tracer: c.cfg.tp.Tracer(scope)}
	var err error
	if m.decisions, err = meter.Int64Counter("tollgate.admission.decisions",
		metric.WithDescription("Admission decisions by decision (admitted; refused, with its reason; cancelled: a request whose caller went away, its context canceled, before it started, while it waited or before admission looked at it, with no reason), class and reason."),
		metric.WithUnit("{decision}")); err != nil {
		return nil, err
	}
	if m.startDelay, err = meter.Float64Histogram("tollgate.task.start_delay",
		metric.WithDescription("Time from arrival to start of admitted requests."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, err
	}
	if m.serviceTime, err = meter.Float64Histogram("tollgate.task.service_time",
		metric.WithDescription("Time from start to release of admitted requests."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, err
	}
	if m.misses, err = meter.Int64Counter("tollgate.deadline.misses",
		metric.WithDescription("Deadlines missed, by stage: arrival (a try that came after its attempt's deadline, or a server-streaming try whose one request did not come by its deadline, refused by the server interceptor before admission), begin (a recorded try whose deadline passed while the server interceptor began its record, before its handler ran), admission (arrived expired), dequeue (expired while waiting, dropped unrun), run (finished late)."),
		metric.WithUnit("{request}")); err != nil {
		return nil, err
	}
	if m.predErr, err = meter.Float64Histogram("tollgate.queue.wait_prediction_error",
		metric.WithDescription("How far the wait predicted for a request that waited in the queue and started was from its actual wait (absolute; direction under: waited longer than predicted, over: waited less, exact: as predicted)."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, err
	}
	if m.modeChanges, err = meter.Int64Counter("tollgate.admission.mode_transitions",
		metric.WithDescription("Changes of the degradation state machine's mode (as Stats().Transitions counts them), by the mode entered and the previous one: NORMAL, DEGRADED or RECOVERING."),
		metric.WithUnit("{transition}")); err != nil {
		return nil, err
	}
	m.modeAttrs = map[[2]Mode][]metric.AddOption{}
	for to := ModeNormal; to <= ModeRecovering; to++ {
		for from := ModeNormal; from <= ModeRecovering; from++ {
			m.modeAttrs[[2]Mode{to, from}] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
				attribute.String("mode", to.String()), attribute.String("previous", from.String())))}
		}
	}
	stage := func(s string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("stage", s)))}
	}
	m.missAdmission, m.missDequeue, m.missRun = stage("admission"), stage("dequeue"), stage("run")
	work, err := meter.Float64ObservableGauge("tollgate.queue.estimated_work",
		metric.WithDescription("Estimated work waiting in the class's queue."), metric.WithUnit("s"))
	if err != nil {
		return nil, err
	}
	age, err := meter.Float64ObservableGauge("tollgate.queue.oldest_age",
		metric.WithDescription("Wait so far of the oldest request in the class's queue."), metric.WithUnit("s"))
	if err != nil {
		return nil, err
	}
	fa, err := meter.Int64ObservableCounter("tollgate.admission.false_accepts",
		metric.WithDescription("Admitted requests that finished after their deadline."), metric.WithUnit("{request}"))
	if err != nil {
		return nil, err
	}
	fr, err := meter.Int64ObservableCounter("tollgate.admission.false_rejects",
		metric.WithDescription("DEADLINE_UNREACHABLE refusals judged avoidable from later starts."), metric.WithUnit("{request}"))
	if err != nil {
		return nil, err
	}
	mode, err := meter.Int64ObservableGauge("tollgate.admission.mode",
		metric.WithDescription("Effective mode: 1 normal, 2 degraded, 3 recovering."))
	if err != nil {
		return nil, err
	}
	running, err := meter.Int64ObservableUpDownCounter("tollgate.admission.running",
		metric.WithDescription("Requests of the class running now, on its own slots or borrowed ones (Stats' Running)."),
		metric.WithUnit("{request}"))
	if err != nil {
		return nil, err
	}
	used, err := meter.Int64ObservableUpDownCounter("tollgate.admission.slots_used",
		metric.WithDescription("The class's slots in use now, by its requests or borrowers (Stats' UsedSlots)."),
		metric.WithUnit("{slot}"))
	if err != nil {
		return nil, err
	}
	queued, err := meter.Int64ObservableUpDownCounter("tollgate.queue.length",
		metric.WithDescription("Requests waiting in the class's queue now (Stats' Queued)."),
		metric.WithUnit("{request}"))
	if err != nil {
		return nil, err
	}
	for _, cs := range c.classes {
		set := attribute.NewSet(attribute.String("class", cs.cfg.Name))
		a := &classAttrs{
			admitted: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
				attribute.String("decision", "admitted"), attribute.String("class", cs.cfg.Name), attribute.String("reason", "")))},
			cancelled: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
				attribute.String("decision", "cancelled"), attribute.String("class", cs.cfg.Name), attribute.String("reason", "")))},
			refused: map[status.Reason][]metric.AddOption{},
			record:  []metric.RecordOption{metric.WithAttributeSet(set)},
			observe: []metric.ObserveOption{metric.WithAttributeSet(set)},
		}
		direction := func(d string) []metric.RecordOption {
			return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(
				attribute.String("class", cs.cfg.Name), attribute.String("direction", d)))}
		}
		a.predUnder, a.predOver, a.predExact = direction("under"), direction("over"), direction("exact")
		for r := status.ReasonUnspecified; r <= status.ReasonCallKeyRequired; r++ {
			a.refused[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
				attribute.String("decision", "refused"), attribute.String("class", cs.cfg.Name),
				attribute.String("reason", status.ReasonName(r))))}
		}
		cs.attrs = a
	}
	m.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		// Collecting is an observation: it changes nothing, unlike Mode
		// and Stats, which bring the controller up to date first. The
		// gauges say how things are now — the mode as advance would leave
		// it (peekMode) — on the controller's own clock; on the virtual
		// clock of a caller driving it with AdmitAt, whose time the wall
		// clock says nothing of, as of the latest time that caller gave.
		c.mu.Lock()
		defer c.mu.Unlock()
		now := c.nowLocked()
		for _, cs := range c.classes {
			o.ObserveFloat64(work, time.Duration(cs.queuedWork).Seconds(), cs.attrs.observe...)
			var oldest time.Duration
			if cs.queue.head != nil {
				oldest = max(now.Sub(cs.queue.head.enq), 0)
			}
			o.ObserveFloat64(age, oldest.Seconds(), cs.attrs.observe...)
			o.ObserveInt64(fa, int64(cs.falseAccepts), cs.attrs.observe...)
			o.ObserveInt64(fr, int64(cs.falseRejects), cs.attrs.observe...)
			o.ObserveInt64(running, int64(cs.running), cs.attrs.observe...)
			o.ObserveInt64(used, int64(cs.used), cs.attrs.observe...)
			o.ObserveInt64(queued, int64(cs.queue.n), cs.attrs.observe...)
		}
		o.ObserveInt64(mode, int64(c.peekMode(now)))
		return nil
	}, work, age, fa, fr, mode, running, used, queued)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (m *instruments) close() error { return m.reg.Unregister() }

func (m *instruments) admitted(ctx context.Context, cs *classState, waited time.Duration) {
	m.decisions.Add(ctx, 1, cs.attrs.admitted...)
	m.startDelay.Record(ctx, waited.Seconds(), cs.attrs.record...)
}

// predictionError records a waiter's actual minus predicted wait d as its
// absolute value, with the direction: a histogram takes no negative value
// (they would all fall in its lowest bucket, and make a negative sum).
func (m *instruments) predictionError(ctx context.Context, cs *classState, d time.Duration) {
	switch {
	case d > 0:
		m.predErr.Record(ctx, d.Seconds(), cs.attrs.predUnder...)
	case d < 0:
		m.predErr.Record(ctx, (-d).Seconds(), cs.attrs.predOver...)
	default:
		m.predErr.Record(ctx, 0, cs.attrs.predExact...)
	}
}

func (m *instruments) refused(ctx context.Context, cs *classState, r status.Reason) {
	if opts, ok := cs.attrs.refused[r]; ok {
		m.decisions.Add(ctx, 1, opts...)
	}
}

// cancelled counts a waiter whose context was canceled before it started:
// its caller went away, and the server refused nothing.
func (m *instruments) cancelled(ctx context.Context, cs *classState) {
	m.decisions.Add(ctx, 1, cs.attrs.cancelled...)
}

func (m *instruments) tapRefused(ctx context.Context, cs *classState, r status.Reason) {
	m.refused(ctx, cs, r)
}

func (m *instruments) served(cs *classState, d time.Duration) {
	m.serviceTime.Record(context.Background(), max(d, 0).Seconds(), cs.attrs.record...)
}

// missAdmissionAdd and missDequeueAdd count a deadline miss with the
// request's context (its trace makes the exemplar); a miss of the run stage,
// and a service time, are counted at Permit.Release, which has no context.
func (m *instruments) missAdmissionAdd(ctx context.Context) { m.misses.Add(ctx, 1, m.missAdmission...) }

func (m *instruments) missDequeueAdd(ctx context.Context) { m.misses.Add(ctx, 1, m.missDequeue...) }

func (m *instruments) missRunAdd() { m.misses.Add(context.Background(), 1, m.missRun...) }

// traceEvent is a mode change or override event, emitted after unlocking.
type traceEvent struct {
	name       string
	action     string
	ovr        ActiveOverride
	mode, prev Mode
	at         time.Time
	ctx        context.Context
}

// traceLocked queues a trace event.
func (c *Controller) traceLocked(t traceEvent) { c.traces = append(c.traces, t) }

// overrideAttrs are the attributes of an override's event (as Override's
// doc lists them): what it is and who set it, and only the fields it sets,
// so that a freeze does not read as slots=0 or mode=UNSET.
func overrideAttrs(action string, o ActiveOverride) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs,
		attribute.String("action", action),
		attribute.Int64("id", int64(o.ID)),
		attribute.String("actor", o.Actor),
		attribute.String("reason", o.Reason),
		attribute.String("expires", o.Expires.UTC().Format(time.RFC3339Nano)))
	if o.Class != "" {
		attrs = append(attrs, attribute.String("tollgate.class", o.Class))
	}
	if o.Freeze {
		attrs = append(attrs, attribute.Bool("freeze", true))
	}
	if o.Slots > 0 {
		attrs = append(attrs, attribute.Int("slots", o.Slots))
	}
	if o.QueueItems > 0 {
		attrs = append(attrs, attribute.Int("queue_items", o.QueueItems))
	}
	if o.Mode != 0 {
		attrs = append(attrs, attribute.String("mode", o.Mode.String()))
	}
	return attrs
}

// trace emits t as an event on a short span of its own and, when t carries
// a context with a recording span, on that span too. A mode change also
// counts in tollgate.admission.mode_transitions, which neither sampling nor
// the time between two scrapes of the mode gauge can lose.
func (m *instruments) trace(t traceEvent) {
	var attrs []attribute.KeyValue
	if t.action != "" {
		attrs = overrideAttrs(t.action, t.ovr)
	} else {
		attrs = []attribute.KeyValue{attribute.String("mode", t.mode.String()), attribute.String("previous", t.prev.String())}
		if opts, ok := m.modeAttrs[[2]Mode{t.mode, t.prev}]; ok {
			m.modeChanges.Add(context.Background(), 1, opts...)
		}
	}
	ev := []trace.EventOption{trace.WithAttributes(attrs...), trace.WithTimestamp(t.at)}
	if t.ctx != nil {
		if sp := trace.SpanFromContext(t.ctx); sp.IsRecording() {
			sp.AddEvent(t.name, ev...)
		}
	}
	_, sp := m.tracer.Start(context.Background(), t.name, trace.WithTimestamp(t.at))
	sp.AddEvent(t.name, ev...)
	sp.End(trace.WithTimestamp(t.at))
}

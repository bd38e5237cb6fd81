package admission_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// epoch is the virtual clock's start.
var epoch = time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)

// clock is a virtual clock tests advance by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: epoch} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// result is what one AdmitDecision call returned.
type result struct {
	id       int
	permit   *admission.Permit
	decision admission.Decision
	err      error
}

// harness drives a controller on a virtual clock, one operation at a time,
// so that every event and every result belongs to the operation that caused
// it. It never sleeps: it waits on the observer's events and on results.
type harness struct {
	t      testing.TB
	clk    *clock
	ctrl   *admission.Controller
	events chan admission.Event
	// cancelEvents are the events the last cancel logged (the drop, and
	// the starts it let happen).
	cancelEvents []admission.Event
	results      chan result
	wg           sync.WaitGroup
	nextID       int
	cancels      map[int]context.CancelFunc
	decided      map[int]admission.Event // each request's decision event
	done         map[int]result          // results not yet collected by the test
	log          []admission.Event
	mu           sync.Mutex
	viol         []error
}

func newHarness(t testing.TB, opts ...admission.Option) *harness {
	t.Helper()
	h := &harness{
		t: t, clk: newClock(),
		events:  make(chan admission.Event, 1<<14),
		results: make(chan result, 1<<12),
		cancels: map[int]context.CancelFunc{},
		decided: map[int]admission.Event{},
		done:    map[int]result{},
	}
	opts = append([]admission.Option{
		admission.WithClock(h.clk.Now),
		admission.WithObserver(func(e admission.Event) { h.events <- e }),
		admission.WithInvariantCheck(func(err error) {
			if err != nil {
				h.mu.Lock()
				h.viol = append(h.viol, err)
				h.mu.Unlock()
			}
		}),
	}, opts...)
	ctrl, err := admission.New(opts...)
	require.NoError(t, err)
	h.ctrl = ctrl
	t.Cleanup(func() {
		for _, c := range h.cancels {
			c()
		}
		h.wg.Wait()
		require.NoError(t, ctrl.Close())
		h.mu.Lock()
		defer h.mu.Unlock()
		require.Empty(t, h.viol, "invariant 9 violated")
	})
	return h
}

// settles reports how many Admit calls an event ends.
func settles(e admission.Event) int {
	switch e.Kind {
	case admission.EventAdmitted, admission.EventRefused, admission.EventStarted, admission.EventDropped:
		return 1
	}
	return 0
}

// collect reads n results into h.done, and checks that each result's
// Decision agrees with the request's decision event (the controller's own
// account of the same moment) and with its permit.
func (h *harness) collect(n int) {
	h.t.Helper()
	for range n {
		r := <-h.results
		e := h.decided[r.id]
		require.Equal(h.t, e.Class, r.decision.Class, "request %d: decision's class", r.id)
		require.Equal(h.t, e.QueuedAhead, r.decision.QueuedAhead, "request %d: decision's queued-ahead", r.id)
		if r.permit != nil {
			require.Equal(h.t, r.decision.QueuedAhead, r.permit.QueuedAhead(), "request %d: permit's queued-ahead", r.id)
			require.Equal(h.t, r.decision.Class, r.permit.Class(), "request %d: permit's class", r.id)
		}
		h.done[r.id] = r
	}
}

// drain takes the events already emitted and collects the results they
// announce.
func (h *harness) drain() []admission.Event {
	var evs []admission.Event
	for {
		select {
		case e := <-h.events:
			evs = append(evs, e)
		default:
			n := 0
			for _, e := range evs {
				n += settles(e)
			}
			h.collect(n)
			h.log = append(h.log, evs...)
			return evs
		}
	}
}

// arrive starts AdmitDecision for r at the clock's time and returns once the
// controller decided (admitted, queued or refused), with the request's id
// and the decision event.
func (h *harness) arrive(r admission.Request) (int, admission.Event) {
	ctx, cancel := context.WithCancel(context.Background())
	return h.arriveCtx(ctx, cancel, r)
}

// arriveCtx is arrive on ctx, which cancel ends (h.cancel).
func (h *harness) arriveCtx(ctx context.Context, cancel context.CancelFunc, r admission.Request) (int, admission.Event) {
	h.nextID++
	id := h.nextID
	h.cancels[id] = cancel
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		p, d, err := h.ctrl.AdmitDecision(ctx, r)
		h.results <- result{id: id, permit: p, decision: d, err: err}
	}()
	var evs []admission.Event
	for {
		e := <-h.events
		evs = append(evs, e)
		if e.Kind == admission.EventAdmitted || e.Kind == admission.EventQueued || e.Kind == admission.EventRefused {
			h.decided[id] = e
			n := 0
			for _, e := range evs {
				n += settles(e)
			}
			h.collect(n)
			h.log = append(h.log, evs...)
			return id, e
		}
	}
}

// take returns the result of request id, which must have been decided.
func (h *harness) take(id int) result {
	h.t.Helper()
	r, ok := h.done[id]
	require.True(h.t, ok, "request %d not decided", id)
	delete(h.done, id)
	return r
}

// admitted arrives r and requires it to get a permit at once.
func (h *harness) admitted(r admission.Request) *admission.Permit {
	h.t.Helper()
	id, e := h.arrive(r)
	require.Equal(h.t, admission.EventAdmitted, e.Kind, "reason %v", e.Reason)
	res := h.take(id)
	require.NoError(h.t, res.err)
	return res.permit
}

// refused arrives r and requires a refusal with reason.
func (h *harness) refused(r admission.Request, reason status.Reason) error {
	h.t.Helper()
	id, e := h.arrive(r)
	require.Equal(h.t, admission.EventRefused, e.Kind)
	res := h.take(id)
	require.Error(h.t, res.err)
	require.Equal(h.t, reason, status.OutcomeOf(res.err).Reason, "%v", res.err)
	require.Equal(h.t, status.KindNotAdmitted, status.OutcomeOf(res.err).Kind)
	return res.err
}

// queued arrives r and requires it to wait.
func (h *harness) queued(r admission.Request) int {
	h.t.Helper()
	id, e := h.arrive(r)
	require.Equal(h.t, admission.EventQueued, e.Kind, "kind %v reason %v", e.Kind, e.Reason)
	return id
}

// release releases p now and returns the events it caused.
func (h *harness) release(p *admission.Permit) []admission.Event {
	p.Release()
	return h.drain()
}

// cancel ends the context of waiting request id and collects its result.
// Leaving the queue may start other waiters (a lender's idle slot can be
// lent again): their Started events follow the Dropped one, emitted under
// the same lock, so all of them are in h.events once id's result arrives;
// the results of those starts may arrive before or after id's.
func (h *harness) cancel(id int) result {
	h.cancels[id]()
	h.cancelEvents = h.cancelEvents[:0]
	for {
		e := <-h.events
		h.log = append(h.log, e)
		h.cancelEvents = append(h.cancelEvents, e)
		if e.Kind == admission.EventDropped {
			break
		}
	}
	early := 0 // results of other requests collected while waiting for id's
	for {
		h.collect(1)
		if _, ok := h.done[id]; ok {
			break
		}
		early++
	}
	n := 0
	for drained := false; !drained; {
		select {
		case e := <-h.events:
			h.log = append(h.log, e)
			h.cancelEvents = append(h.cancelEvents, e)
			n += settles(e)
		default:
			drained = true
		}
	}
	h.collect(n - early)
	return h.take(id)
}

// tick advances the clock and lets the controller close windows and expire
// overrides.
func (h *harness) tick(d time.Duration) []admission.Event {
	h.clk.Advance(d)
	h.ctrl.Mode()
	return h.drain()
}

func work(method string) admission.Request { return admission.Request{Method: method, Size: -1} }

// newMeteredHarness is newHarness with a meter provider that the returned
// manual reader reads; the provider is shut down when the test ends,
// before the harness's own clean-up.
func newMeteredHarness(t testing.TB, opts ...admission.Option) (*harness, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	h := newHarness(t, append([]admission.Option{admission.WithMeterProvider(mp)}, opts...)...)
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return h, reader
}

// peekedMode is the mode the metrics' peek reports: the one data point of
// the tollgate.admission.mode gauge.
func peekedMode(t *testing.T, reader *sdkmetric.ManualReader) admission.Mode {
	t.Helper()
	gauge := collect(t, reader)["tollgate.admission.mode"].Data.(metricdata.Gauge[int64])
	require.Len(t, gauge.DataPoints, 1)
	return admission.Mode(gauge.DataPoints[0].Value)
}

// override sets o, requires it accepted, and settles what it started.
func (h *harness) override(o admission.Override) {
	h.t.Helper()
	_, err := h.ctrl.SetOverride(context.Background(), o)
	require.NoError(h.t, err)
	h.drain()
}

// streamOn is a stream request for method m.
func streamOn(m string) admission.Request {
	return admission.Request{Method: m, Size: -1, Stream: true}
}

// Methods of the classes lendAndBorrowOptions configures.
const (
	bM      = "/demo.B/Do"
	lenderM = "/demo.Lender/Do"
)

// lendAndBorrowOptions configures the classes first (if any), then opt
// (2 slots, 4 queued, lends idle slots), b (1 slot) and lender (1 slot,
// lenderQueue queued, lends idle slots), all expected to serve in 100ms;
// bM is b's, lenderM the lender's.
func lendAndBorrowOptions(lenderQueue int, first ...admission.Class) []admission.Option {
	const est = 100 * time.Millisecond
	classes := append(first,
		admission.Class{Name: "opt", Slots: 2, QueueItems: 4, LendIdle: true, ExpectedServiceTime: est},
		admission.Class{Name: "b", Slots: 1, ExpectedServiceTime: est},
		admission.Class{Name: "lender", Slots: 1, QueueItems: lenderQueue, LendIdle: true, ExpectedServiceTime: est})
	return []admission.Option{
		admission.WithClasses(classes...),
		admission.WithMethods("b", "/demo.B/"),
		admission.WithMethods("lender", "/demo.Lender/"),
	}
}

// longBorrowedStream starts one of b's streams on b's own slot and a
// second that borrows one of opt's idle slots, ends the first, and lets
// 10s pass: the borrowing stream, returned, is expected to live as long
// again.
func (h *harness) longBorrowedStream() *admission.Permit {
	b1 := h.admitted(streamOn(bM))   // on b's own slot
	long := h.admitted(streamOn(bM)) // borrows one of opt's idle slots
	b1.Abandon()
	h.drain()
	h.clk.Advance(10 * time.Second)
	return long
}

// arriveWithin2s sends a unary request of the main method (opt's in the
// lend-and-borrow set-up) with a deadline 2s away.
func (h *harness) arriveWithin2s() (int, admission.Event) {
	req := work(mainM)
	req.Deadline = h.clk.Now().Add(2 * time.Second)
	return h.arrive(req)
}

// refusedUnreachableBeforeShortEnds requires a request arriving with a
// deadline 2s away refused DEADLINE_UNREACHABLE at once; were it queued,
// the test fails saying whether it was decided once short, the request
// whose slot went to the one the prediction overlooked (what), ended.
// short is released either way.
func (h *harness) refusedUnreachableBeforeShortEnds(t *testing.T, short *admission.Permit, what string) {
	t.Helper()
	id, e := h.arriveWithin2s()
	if e.Kind == admission.EventQueued {
		h.clk.Advance(100 * time.Millisecond)
		short.Release()
		h.drain()
		_, decided := h.done[id]
		t.Fatalf("queued on a prediction of the slot %s (decided once that slot freed: %v)", what, decided)
	}
	require.Equal(t, admission.EventRefused, e.Kind)
	require.Equal(t, status.ReasonDeadlineUnreachable, e.Reason)
	short.Release()
	h.drain()
}

// shortStream admits a stream of the main method (opt's in the
// lend-and-borrow set-up) whose handler's context ends in 1s.
func (h *harness) shortStream() *admission.Permit {
	r := streamOn(mainM)
	r.Deadline = h.clk.Now().Add(time.Second)
	return h.admitted(r)
}

// mainOf1s configures the one class main: slots slots, 4 queued, each
// request expected to serve in 1s.
func mainOf1s(slots int) admission.Option {
	return admission.WithClasses(admission.Class{Name: "main", Slots: slots, QueueItems: 4,
		ExpectedServiceTime: time.Second})
}

// refusedUnreachable arrives r and requires it refused DEADLINE_UNREACHABLE
// at once, failing with why if it was not; a request queued instead is
// cancelled first, so that it waits no longer.
func (h *harness) refusedUnreachable(r admission.Request, why string) {
	h.t.Helper()
	id, e := h.arrive(r)
	if e.Kind == admission.EventQueued {
		h.cancel(id)
	} else if res := h.take(id); res.permit != nil {
		res.permit.Release()
	}
	require.Equal(h.t, admission.EventRefused, e.Kind, why)
	require.Equal(h.t, status.ReasonDeadlineUnreachable, e.Reason)
}

// waiterStartsAt1s lets 1s pass and ends the unary call u; requires the
// waiter queued behind it (a request of 1s) started on its slot
// (msgAndArgs says why on failure), then ends the waiter and stream.
func (h *harness) waiterStartsAt1s(u *admission.Permit, waiter int, stream *admission.Permit, msgAndArgs ...any) {
	h.t.Helper()
	h.clk.Advance(time.Second)
	h.release(u)
	res := h.take(waiter)
	require.NoError(h.t, res.err, msgAndArgs...)
	res.permit.Release()
	stream.Abandon()
	h.drain()
}

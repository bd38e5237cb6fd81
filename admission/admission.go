package admission

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/status"
	grpcstatus "google.golang.org/grpc/status"
)

// Request is what the controller knows of a request when it decides.
type Request struct {
	// Method is the full gRPC method name, "/pkg.Service/Method".
	Method string
	// Tenant is the caller's tenant as the interceptor resolved it; "" for
	// none (no tenant limits apply).
	Tenant string
	// Size is the request's size in bytes; negative when unknown (a stream
	// admitted when it opens, before any message arrived).
	// Unknown sizes pass the size stage and count 0 queued bytes.
	Size int
	// Deadline is the time by which the work must finish; zero for none.
	// Admit does not read ctx's deadline: the interceptor passes the
	// attempt's deadline here.
	Deadline time.Time
	// StartBy is the time by which the work must start; zero for none. It
	// is for work whose caller stops waiting before the work's deadline:
	// the interceptor passes a recorded unary call's try deadline here (its
	// handler runs detached until Deadline, but the try waits in the queue
	// on its client's context). A request that finds no free slot and
	// whose predicted wait ends after it is refused DEADLINE_UNREACHABLE
	// (the deadline stage), rather than queued to be dropped when its
	// caller gives up. It bounds the predicted wait on arrival only: a
	// waiter is not dropped at StartBy (its context, which the caller ends
	// when it stops waiting, ends the wait), nor is a request refused that
	// finds a free slot.
	StartBy time.Time
	// Stream marks a request that opens a stream, whose slot is held for
	// the stream's lifetime (DESIGN.md §3.9), which is no service time:
	// the predicted waits and retry-afters, while a stream holds one of
	// its class's slots, expect the queue to run on the slots as the
	// requests on them end, a stream at its deadline (one without a
	// deadline never) — or, only while streams hold every slot (nothing
	// else could free one), each stream living as long again as it has
	// lived (at least the class's mean, no later than its deadline). End
	// its permit with EndStream, which teaches nothing but judges its
	// deadline (Abandon when it never ran).
	Stream bool
	// Control marks control-path work whatever its Method: it is admitted
	// in the control class, as the control methods are, under its Tenant
	// (so that the class's tenant limits hold). tollgate's interceptor
	// sets it for a trusted peer's try that came after its attempt's
	// deadline, which only reads its call's record, as an AttemptService
	// query does (DESIGN.md §3.7, §3.12). Without a control class
	// ([WithoutControlClass]) it is ignored, and the request is classified
	// like any other.
	Control bool
}

// Permit is the right to run one admitted request. End it exactly once, when
// the work ends: with [Permit.Release] when the work ran (or
// [Permit.ReleaseMissCounted] when its caller has counted its deadline miss
// already), with [Permit.Abandon] when it did not (a replayed record, a
// refusal after admission), or with [Permit.EndStream] when it ran but its
// lifetime is not a service time (a stream). Whichever comes first wins;
// further calls of any do nothing. A Permit is safe for
// concurrent use; its zero value is not useful.
type Permit struct {
	c        *Controller
	cs       *classState // the request's class
	owner    *classState // the class whose slot it holds
	tenant   string
	start    time.Time
	startOff float64 // ns since the controller's epoch
	// endOff is its deadline in ns since the epoch, 0 for none: a stream
	// holds its slot no longer (its handler's context ends there).
	endOff float64
	stream bool // Request.Stream
	// virtual is set when start is a time a caller gave (the controller
	// was driven on a virtual clock when the permit started): a plain
	// Release, which has no time of its own, then teaches no service time.
	virtual  bool
	deadline time.Time
	ahead    int // requests of its class waiting ahead of it when decided
	released atomic.Bool

	prev, next *Permit // the class's running list; the controller's lock guards them
}

// Release returns the permit's slot, hands it to the next waiting request
// that can still finish in time, and teaches the class its service time.
// Calling it more than once does nothing. It never blocks for long: it takes
// the controller's lock once.
//
// It acts at the controller's own clock, the wall clock, never
// before the latest time it saw; but while the controller is driven on a
// virtual clock (its last admission an AdmitAt), at the latest time the
// caller gave, as [Controller.Stats] and the other forms without a time
// do, so that it does not move the caller's time to the wall clock. That
// time is only the earliest the work can have ended: when either the
// release or the permit's start was a caller's time, Release teaches no
// service time (nor records one in tollgate.task.service_time), since
// the one measured would be a lower bound (zero right after the
// admission) or span two clocks; it still counts a finish after the
// deadline, which the time it acts at proves when the permit started on
// the same kind of clock (a permit started by AdmitAt and released after
// an Admit returned the controller to the wall clock, or the reverse, is
// judged against no deadline). [Permit.ReleaseAt] gives the end time and
// teaches.
func (p *Permit) Release() {
	if p == nil || p.c == nil {
		return
	}
	p.releaseNow(true)
}

// ReleaseAt is [Permit.Release] at time now, for simulations that drive the
// controller on a virtual clock (see [Controller.AdmitAt]).
func (p *Permit) ReleaseAt(now time.Time) { p.release(now, true) }

// ReleaseMissCounted is [Permit.Release] (at the time Release acts at, and
// teaching what Release teaches) for work whose deadline miss, if
// it has one, its caller has already counted in tollgate.deadline.misses
// under a stage of its own: it returns the slot, teaches the class its
// service time and counts a late finish in the class's false accepts, as
// Release does, but counts no miss of stage run, so that the request is
// counted once. tollgate's server interceptor uses it for the lookup of a
// try that came after its attempt's deadline and was refused for that
// (stage arrival): the try's own deadline may pass while it is refused.
// Like Release it ends the permit exactly once, and does nothing on a nil
// Permit.
func (p *Permit) ReleaseMissCounted() {
	if p == nil || p.c == nil {
		return
	}
	p.releaseNow(false)
}

// ReleaseMissCountedAt is [Permit.ReleaseMissCounted] at time now (virtual
// clocks).
func (p *Permit) ReleaseMissCountedAt(now time.Time) { p.release(now, false) }

// release is ReleaseAt, counting a late finish as a run miss when
// countMiss is set.
func (p *Permit) release(now time.Time, countMiss bool) {
	if p == nil || p.c == nil || !p.released.CompareAndSwap(false, true) {
		return
	}
	c := p.c
	c.mu.Lock()
	c.advance(now)
	late := c.releaseLocked(p, now, true, true)
	c.unlock()
	if late && countMiss {
		c.m.missRunAdd()
	}
	c.m.served(p.cs, now.Sub(p.start))
}

// releaseNow is Release (ReleaseMissCounted without countMiss): release at
// nowLocked, teaching the service time only when both the permit's start
// and the release are on the controller's own clock, and judging its
// deadline only when both are on the same kind of clock (a deadline of the
// caller's clock says nothing against the wall clock's time, nor the
// reverse).
func (p *Permit) releaseNow(countMiss bool) {
	if !p.released.CompareAndSwap(false, true) {
		return
	}
	c := p.c
	c.mu.Lock()
	now := c.nowLocked()
	teach := !p.virtual && !c.virtual
	judge := p.virtual == c.virtual
	c.advance(now)
	late := c.releaseLocked(p, now, teach, judge)
	c.unlock()
	if late && countMiss {
		c.m.missRunAdd()
	}
	if teach {
		c.m.served(p.cs, now.Sub(p.start))
	}
}

// Abandon returns the permit's slot exactly like [Permit.Release] but
// teaches the class nothing, and judges no deadline: use it for work that
// never ran (a try answered from its record, a refusal after admission,
// a stream refused before its handler) so that instant permits do not
// distort the learned service time; end a stream that ran with
// [Permit.EndStream]. Release and Abandon together
// end a permit exactly once: whichever comes first wins, later calls do
// nothing (as does ReleaseMissCounted). Abandon on a nil Permit does
// nothing. It acts at the time [Permit.Release] acts at: while the
// controller is driven on a virtual clock, the latest time the caller gave.
func (p *Permit) Abandon() {
	if p == nil || p.c == nil || !p.released.CompareAndSwap(false, true) {
		return
	}
	c := p.c
	c.mu.Lock()
	p.abandonLocked(c.nowLocked())
}

// EndStream is [Permit.Abandon] for a stream, whose lifetime is not a
// service time but whose deadline still holds: it returns the slot and
// teaches the class nothing, as Abandon does, and judges the permit's
// deadline as [Permit.Release] does, so that a stream that ends after it
// (its handler's context ran out while it ran) counts as a false accept
// and as a miss of stage run in tollgate.deadline.misses, as a unary
// request that finishes late does. It ends the permit exactly once with
// the others, acts at the time Release acts at, and does nothing on a nil
// Permit.
func (p *Permit) EndStream() {
	if p == nil || p.c == nil || !p.released.CompareAndSwap(false, true) {
		return
	}
	c := p.c
	c.mu.Lock()
	now := c.nowLocked()
	c.advance(now)
	late := c.releaseLocked(p, now, false, p.virtual == c.virtual)
	c.unlock()
	if late {
		c.m.missRunAdd()
	}
}

// AbandonAt is [Permit.Abandon] at time now (virtual clocks).
func (p *Permit) AbandonAt(now time.Time) {
	if p == nil || p.c == nil || !p.released.CompareAndSwap(false, true) {
		return
	}
	p.c.mu.Lock()
	p.abandonLocked(now)
}

// abandonLocked ends p, abandoned, at now with the lock held; it unlocks.
func (p *Permit) abandonLocked(now time.Time) {
	c := p.c
	c.advance(now)
	c.releaseLocked(p, now, false, false)
	c.unlock()
}

// Class returns the name of the class the permit's request belongs to, or
// "" for a nil Permit.
func (p *Permit) Class() string {
	if p == nil || p.cs == nil {
		return ""
	}
	return p.cs.cfg.Name
}

// QueuedAhead returns how many requests of the permit's class were waiting
// ahead of its request when the controller decided it: for a request that
// waited, the requests in the queue when it joined it; 0 for one that got a
// slot on arrival, and for a nil Permit. It is the [Decision.QueuedAhead] of
// the admission, counted under the controller's lock as it decided, so
// reading it costs nothing.
func (p *Permit) QueuedAhead() int {
	if p == nil {
		return 0
	}
	return p.ahead
}

// Decision is what the controller saw when it decided one request, taken
// under its lock at the moment of the decision (no snapshot, no race with
// other requests). [Controller.AdmitDecision] returns it with the permit or
// the refusal, for per-request telemetry: a refusal's detail does not carry
// the queue (its wire format is fixed), and [Controller.Stats] is a
// snapshot of every class, taken at another moment.
type Decision struct {
	// Class is the name of the class the request was classified into; ""
	// when ctx had ended before the request was looked at.
	Class string
	// QueuedAhead is how many requests of Class were waiting ahead of this
	// one: for a request that joined the queue, those in it when it joined,
	// whether it later started or left unrun (the count its EventQueued
	// carries); for a refusal on arrival, those in the queue it was refused
	// at, after waiters that could no longer finish in time were dropped
	// (the count its EventRefused carries) — except for REQUEST_TOO_LARGE,
	// DRAINING and SHED, decided before anything is dropped, which count
	// them too; 0 for a request that got a slot
	// on arrival, which waited behind no one even when requests held back by
	// their tenant's running limit were waiting.
	QueuedAhead int
}

// Controller admits requests into workload classes: each class has reserved
// slots, a bounded queue and per-tenant limits; requests are refused early
// and with a typed reason when they cannot be served in time. Build it with
// [New]; the zero value is not useful. A Controller is safe for concurrent
// use. On the real clock it keeps timers: a waiter's give-up timer, and,
// while requests wait, one that brings the state up to date when time alone
// changes it (an override expires, a window ends), whose function runs on a
// goroutine of its own as timers' do. [Controller.Close] stops that timer
// (a run already under way finishes), unregisters its metric callbacks and
// refuses waiting and later requests DRAINING, except in the control class.
type Controller struct {
	cfg *config

	classes  []*classState
	byName   map[string]*classState
	exact    map[string]*classState
	services map[string]*classState
	prefixes []prefixClass
	def      *classState
	control  *classState
	m        *instruments

	mu    sync.Mutex
	epoch time.Time
	last  time.Time // latest time seen
	// virtual is set while a caller drives the controller on a clock of
	// its own: by the last admission's kind, AdmitAt or AdmitDecisionAt
	// (set) or Admit and AdmitDecision (cleared). While it is set
	// the time is the caller's to give, so wake is not armed (it reads the
	// wall clock), and the metrics callback, the tap and the calls without
	// a time (nowLocked) act at last; an Admit
	// clears it and arms wake again for its waiters.
	virtual bool
	closed  bool
	queued  int
	// leaving is a waiter whose context has ended while ctxEnded brings
	// the state up to date: still in its queue (the windows it waited
	// through see it wait), but never started, since its client is gone.
	leaving *waiter
	// mortal counts the waiters whose context can end (waiter.mortal), of
	// every class: on a virtual clock each call looks at their contexts
	// (sweepGoneLocked) only while there are any.
	mortal  int
	deg     degradeState
	ovr     overrideState
	pending []Event // observer events to emit after unlocking
	traces  []traceEvent
	viol    error // tests: a start over the limits in force (checkStart)

	// due is when, in Unix nanoseconds, time alone next changes what the
	// tap flags say (an override expires; a window ends while not Normal);
	// 0: never. Past it the tap lets requests through to Admit, which
	// brings the state up to date.
	due atomic.Int64
	// tapVirtual and tapLast mirror virtual and last (Unix nanoseconds)
	// for the tap, which takes no lock to let a request through: while
	// the controller is driven on a virtual clock, the tap's time is the
	// latest the caller gave, as nowLocked's is, not the wall clock's.
	tapVirtual atomic.Bool
	tapLast    atomic.Int64
	// lenderGone sums gone over the classes that lend their idle slots
	// (LendIdle): a lender lends nothing while a waiter stands in its
	// queue, so while one of its waiters has a caller that has gone, any
	// class flagged full may find a slot once Admit takes that waiter out,
	// and the tap lets its requests through (see TapHandle).
	lenderGone atomic.Int32
	// wake brings the state up to date at due (real clock only) while
	// requests wait: an override's end or Recovering's next step may let
	// a waiter start, and no other call may come to start it. wakeAt is
	// when it is armed for (Unix nanoseconds; 0: not armed).
	wake   *time.Timer
	wakeAt int64
	// observerPanics counts the observer's recovered panics (observe).
	observerPanics atomic.Uint64
}

type prefixClass struct {
	prefix string
	cs     *classState
}

type tenantCount struct {
	running, queued int
	work            int64
}

type classState struct {
	cfg      Class
	index    int // in Controller.classes
	slotsCap int // configured slots, lowered by overrides
	queueCap int // configured queue items, lowered by overrides
	frozen   bool

	used    int     // this class's slots held, by it or by borrowers
	running int     // requests of this class running, wherever
	runHead *Permit // the running requests of this class, newest first
	queue   waitList
	// gone counts the waiters of the queue whose context's ending its
	// AfterFunc has noted (noteGone) and that have not left yet: while it
	// is above 0, the next call that takes the lock takes them out
	// (sweepGoneLocked), wherever they stand; and the tap lets requests
	// through to Admit, which does so before it judges the queue (those of
	// every class flagged full, when this class lends: lenderGone). mortal
	// counts the waiters whose context can end (under the lock).
	gone   atomic.Int32
	mortal int
	// heldWaiters counts the waiters whose tenant is at its running limit
	// (TenantRunning): none of them can start until its tenant's running
	// work ends, so a class all of whose waiters are held has nothing to
	// start whatever slots are free (pump skips it).
	heldWaiters int
	queuedBytes int64
	queuedWork  int64
	tenants     map[string]tenantCount
	est         estimator

	// rose is closed, and replaced, when a release at least doubles the
	// class's service estimate over roseAt (the estimate at the last such
	// rise, or the lowest since; the initial estimate at first): the
	// give-up timers of its waiters, armed at deadline less the estimate
	// then, re-arm, so that a waiter the new estimate makes unable to
	// finish gives up on time. Below a doubling a timer fires late by the
	// rise, but still before its deadline, at which no wait is useful; the
	// estimator's own noise (its p95 steps by about a tenth of the mean)
	// never wakes the whole queue.
	rose   chan struct{}
	roseAt time.Duration

	full atomic.Int32 // reason the tap refuses with; 0: open
	// hint is, for the tap's retry-after, the predicted wait (ns) when the
	// class is full; readmit, when it is shed or frozen (SHED), the
	// earliest instant (Unix ns) it can be admitted again
	// (readmitAtLocked). Two atomics, each set before full: a tap call that
	// reads full of one state never reads the other state's kind of value.
	hint, readmit atomic.Int64
	// hopeless is the last instant (Unix ns) at which every waiter of a
	// full queue can still finish, by the queue's deadline bound less the
	// service estimate (one that would finish exactly at its deadline still
	// can): after it the tap lets requests through to Admit, which drops
	// such waiters before it judges the queue full. 0: never.
	hopeless atomic.Int64

	// tapRefused counts the tap's refusals by reason (tapReasons), without
	// the lock; tapFolded (under the lock) is how many of them the
	// degradation windows have already seen.
	tapRefused [len(tapReasons)]atomic.Uint64
	tapFolded  [len(tapReasons)]uint64
	// tapStepped counts, of the tap's refusals, those made while the class
	// was stepped (steppedNow, which refreshFlag keeps): they count in no
	// window, as Admit's do not; tapSteppedFolded is tapFolded's for them.
	tapStepped       [len(tapReasons)]atomic.Uint64
	tapSteppedFolded [len(tapReasons)]uint64
	steppedNow       atomic.Bool
	// wasStepped is stepped as noteSteps last saw it, and unsteppedAt when
	// it last stopped being stepped: a wait counts in the windows only from
	// then, the part before it being the step's.
	wasStepped  bool
	unsteppedAt time.Time

	admitted     uint64
	refused      map[status.Reason]uint64
	cancelled    uint64 // waiters whose context was canceled (ctxEnded)
	falseAccepts uint64
	falseRejects uint64
	rejects      rejectRing
	attrs        *classAttrs
}

// New builds a Controller from opts: the default class (64 slots, 256
// queued) unless [WithClasses] gives classes, the built-in control class
// unless [WithoutControlClass], every stage on, metrics to the global meter
// provider. An invalid configuration is an error wrapping
// [ErrInvalidConfig] that names one invalid setting; when several are
// invalid, which one it names follows New's own order of checks (the
// controller's settings, then the classes, then the method patterns), not
// the order of opts.
func New(opts ...Option) (*Controller, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		cfg:      cfg,
		byName:   map[string]*classState{},
		exact:    map[string]*classState{},
		services: map[string]*classState{},
		epoch:    cfg.now(),
	}
	for _, cl := range cfg.classes {
		cs := &classState{
			cfg:      cl,
			slotsCap: cl.Slots,
			queueCap: cl.QueueItems,
			tenants:  map[string]tenantCount{},
			est:      newEstimator(cl.ExpectedServiceTime, cl.maxServiceTime(), cfg.alpha),
			refused:  map[status.Reason]uint64{},
			rose:     make(chan struct{}),
		}
		cs.roseAt = cs.est.service()
		cs.index = len(c.classes)
		c.classes = append(c.classes, cs)
		c.byName[cl.Name] = cs
	}
	c.def = c.byName[cfg.def]
	c.control = c.byName[ControlClass]
	for _, p := range cfg.patterns {
		cs := c.byName[p.class]
		switch {
		case strings.HasSuffix(p.pat, "*"):
			c.prefixes = append(c.prefixes, prefixClass{strings.TrimSuffix(p.pat, "*"), cs})
		case strings.HasSuffix(p.pat, "/"):
			c.services[p.pat] = cs
		default:
			c.exact[p.pat] = cs
		}
	}
	sort.SliceStable(c.prefixes, func(i, j int) bool { return len(c.prefixes[i].prefix) > len(c.prefixes[j].prefix) })
	c.deg.init(cfg.degradation, c.epoch)
	if c.m, err = newInstruments(c); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.unlock()
	return c, nil
}

// Close unregisters the controller's metric callbacks, refuses every waiting
// request with DRAINING (one whose context has ended leaves as its
// context's ending says: see Admit) and makes later Admit calls refuse the
// same way, except in the control class, which stays open while the server drains:
// callers resolve there the tries it ran (DESIGN.md §3.12), until the
// server itself stops. A DRAINING refusal (UNAVAILABLE, not final) carries
// no retry-after: this server will not admit the request again, and a
// repeat belongs on another one.
// Permits already granted stay valid and may still be released. Close is
// idempotent and returns the error of unregistering the callbacks, if any.
func (c *Controller) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.wake != nil {
		c.wake.Stop()
	}
	// The controller's now, as the waiters' own goroutines (ctxEnded) read
	// it: a waiter whose caller has gone leaves as its context's ending
	// says at that instant (its request's deadline may have passed since
	// the last call showed the controller a time).
	now := c.nowLocked()
	for _, cs := range c.classes {
		if cs == c.control {
			continue // it stays open (decideLocked)
		}
		for w := cs.queue.head; w != nil; {
			next := w.next
			c.dropWaiter(w, status.ReasonDraining, 0, now)
			w = next
		}
	}
	// A lending class whose queue was emptied above lends its idle slots
	// now: the control class's waiters may start on them, as after any
	// other call that empties a lender's queue.
	c.pump(now)
	c.unlock()
	return c.m.close()
}

// Capacity returns how many requests the controller can hold at once:
// every class's configured Slots plus QueueItems, the control class's
// included. Each is a stream on its server's transport, admitted or
// waiting, so a server's per-connection stream limit must exceed it for a
// connection whose classes are full to keep a stream for the control path
// (tollgate's interceptor.ServerOptions raises its default past it). The sum saturates at
// math.MaxInt. It reads only the configuration: no lock, no allocation.
func (c *Controller) Capacity() int {
	n := 0
	for _, cs := range c.classes {
		for _, k := range [2]int{cs.cfg.Slots, cs.cfg.QueueItems} {
			if k > math.MaxInt-n {
				return math.MaxInt
			}
			n += k
		}
	}
	return n
}

// classify returns the class of r.
func (c *Controller) classify(ctx context.Context, r Request) *classState {
	if c.control != nil && c.cfg.control && (r.Control || isControl(r.Method)) {
		return c.control
	}
	if c.cfg.classifier != nil {
		if name := c.cfg.classifier(ctx, r); name != "" {
			if cs, ok := c.byName[name]; ok {
				return cs
			}
		}
	}
	return c.classifyMethod(r.Method)
}

func isControl(m string) bool {
	for _, p := range controlPatterns {
		if strings.HasSuffix(p, "*") {
			if strings.HasPrefix(m, p[:len(p)-1]) {
				return true
			}
		} else if strings.HasPrefix(m, p) {
			return true
		}
	}
	return false
}

// classifyMethod places a method by the patterns alone. It does not allocate.
func (c *Controller) classifyMethod(m string) *classState {
	if cs, ok := c.exact[m]; ok {
		return cs
	}
	if i := strings.LastIndexByte(m, '/'); i > 0 {
		if cs, ok := c.services[m[:i+1]]; ok {
			return cs
		}
	}
	for _, p := range c.prefixes {
		if strings.HasPrefix(m, p.prefix) {
			return p.cs
		}
	}
	return c.def
}

// Admit decides whether r may run, waiting in its class's bounded queue when
// no slot is free. The decision is staged, cheapest first: size; class
// (frozen, shed) and tenant limits; deadline expired or unreachable after the
// predicted wait; a slot, or a place in the bounded queue. A waiting request
// is re-checked when it would start and dropped unrun if it can no longer
// finish in time. It returns a permit, or a NOT_ADMITTED error built by the
// status package (QUEUE_FULL, CONCURRENCY_FULL, DEADLINE_UNREACHABLE,
// DEADLINE_EXPIRED, SHED, TENANT_LIMIT, REQUEST_TOO_LARGE, DRAINING after
// Close) carrying the class and, unless final, a jittered retry-after that
// reflects the queue, below the bound of [WithMaxRetryAfter] (SHED's is the
// time until the class can be admitted again, DRAINING has none: see the
// package documentation); or, when ctx
// ends while the request waits (or before it is looked at), a NOT_ADMITTED
// error that also wraps ctx's error (errors.Is(err, context.Canceled) or
// context.DeadlineExceeded holds): DEADLINE_EXPIRED when a deadline passed
// (ctx's, or the request's, or ctx's cause is context.DeadlineExceeded),
// UNSPECIFIED otherwise (a request whose context was canceled is counted as
// cancelled, not as a refusal, also when another call finds it in the queue,
// to start it, drop it as unable to finish or refuse it, SHED, QUEUE_FULL
// or DRAINING, before this one has seen its context end: a waiter whose
// context has ended is never started, nor refused for another reason).
// Such a
// DEADLINE_EXPIRED is final, with no retry-after, when the request's own
// Deadline has passed, as the deadline stages' refusals are; otherwise (ctx ended by an earlier deadline of its
// own) it is not final and carries a retry-after.
func (c *Controller) Admit(ctx context.Context, r Request) (*Permit, error) {
	p, _, err := c.admit(ctx, r, c.cfg.now(), true)
	return p, err
}

// AdmitAt is [Controller.Admit] at time now. Simulations drive the
// controller on a virtual clock with AdmitAt and [Permit.ReleaseAt]; the
// times given must not go backwards by more than the caller can tolerate
// (windows and overrides only move forward).
func (c *Controller) AdmitAt(ctx context.Context, r Request, now time.Time) (*Permit, error) {
	p, _, err := c.admit(ctx, r, now, false)
	return p, err
}

// AdmitDecision is [Controller.Admit] that also returns the [Decision]: the
// class the request was classified into and how many requests of it were
// queued ahead, as the controller saw them when it decided, whether it
// admitted or refused. It decides, waits and fails exactly as Admit does,
// and costs no more: the decision is read under the lock Admit takes anyway,
// and returning it allocates nothing.
func (c *Controller) AdmitDecision(ctx context.Context, r Request) (*Permit, Decision, error) {
	return c.admit(ctx, r, c.cfg.now(), true)
}

// AdmitDecisionAt is [Controller.AdmitDecision] at time now, for the
// virtual clocks [Controller.AdmitAt] serves.
func (c *Controller) AdmitDecisionAt(ctx context.Context, r Request, now time.Time) (*Permit, Decision, error) {
	return c.admit(ctx, r, now, false)
}

// admit is AdmitDecisionAt. timed is true on the real clock's path (Admit,
// AdmitDecision): a waiter then gives up by a timer of its own (see wait).
func (c *Controller) admit(ctx context.Context, r Request, now time.Time, timed bool) (*Permit, Decision, error) {
	cs := c.classify(ctx, r)
	d := Decision{Class: cs.cfg.Name}
	if err := ctx.Err(); err != nil {
		// Ended before it was looked at: counted as it would have been had
		// it ended while it waited, but as the caller's doing (in no
		// window: the queue held it for nothing).
		c.mu.Lock()
		c.virtual = !timed
		c.advance(now)
		d.QueuedAhead = cs.queue.n
		reason := status.ReasonUnspecified
		final, ra := false, time.Duration(0)
		if deadlineEnded(ctx, r.Deadline, now) {
			reason = status.ReasonDeadlineExpired
			cs.refused[reason]++ // stats only, as an arrival after the deadline
			final, ra = c.expiredRefusalLocked(cs, r.Deadline, now)
		} else {
			cs.cancelled++
		}
		c.emitLocked(Event{Kind: EventRefused, Class: cs.cfg.Name, Tenant: r.Tenant, Reason: reason, At: now, QueuedAhead: d.QueuedAhead})
		c.unlock()
		if reason == status.ReasonDeadlineExpired {
			c.m.missAdmissionAdd(ctx)
			c.m.refused(ctx, cs, reason)
		} else {
			c.m.cancelled(ctx, cs)
		}
		return nil, d, waitEnded(reason, cs, err, ra, final)
	}
	if c.cfg.stages&StageSize != 0 && cs.cfg.MaxRequestBytes > 0 && r.Size > cs.cfg.MaxRequestBytes {
		// The cheapest stage needs no state; the lock only counts it.
		c.mu.Lock()
		c.virtual = !timed
		c.advance(now)
		d.QueuedAhead = cs.queue.n
		c.countRefusal(cs, status.ReasonRequestTooLarge)
		c.emitLocked(Event{Kind: EventRefused, Class: cs.cfg.Name, Tenant: r.Tenant, Reason: status.ReasonRequestTooLarge, At: now, QueuedAhead: d.QueuedAhead})
		c.unlock()
		c.m.refused(ctx, cs, status.ReasonRequestTooLarge)
		return nil, d, refusal(cs, status.ReasonRequestTooLarge, 0, true)
	}
	c.mu.Lock()
	c.virtual = !timed
	c.advance(now)
	p, w, reason, ra, ahead := c.decideLocked(r, cs, now)
	if w != nil {
		w.ctx = ctx // before any other call can find it in the queue
		if ctx.Done() != nil {
			// Its context can end: count it for the virtual clock's look
			// (sweepGoneLocked), and have the context's own AfterFunc note
			// its ending at once, whatever its goroutine is doing (waiting
			// for the lock, held by the observer), so that the next call
			// takes it out. Registered under the lock, before the
			// observer runs; f takes no lock.
			w.mortal = true
			cs.mortal++
			c.mortal++
			w.stop = context.AfterFunc(ctx, func() { c.noteGone(w) })
		}
	}
	c.unlock()
	d.QueuedAhead = ahead
	switch {
	case p != nil:
		c.m.admitted(ctx, cs, 0)
		return p, d, nil
	case w == nil:
		if reason == status.ReasonDeadlineExpired {
			c.m.missAdmissionAdd(ctx)
		}
		c.m.refused(ctx, cs, reason)
		return nil, d, refusal(cs, reason, ra, reason == status.ReasonDeadlineExpired)
	}
	p, err := c.wait(ctx, w, timed && c.cfg.realClock)
	if w.stop != nil {
		w.stop() // it no longer waits: its ending is no one's to note
	}
	return p, d, err
}

// noteGone is the AfterFunc of waiter w's context: it notes, without the
// lock, that w's caller has gone while w may still wait (its class's
// gone), so that the next call that takes the lock takes w out
// (sweepGoneLocked) rather than leaving it in its place until its own
// goroutine gets there. A waiter that has left already is not counted.
func (c *Controller) noteGone(w *waiter) {
	if !w.state.CompareAndSwap(waiterQueued, waiterGone) {
		return
	}
	w.cs.gone.Add(1)
	if w.cs.cfg.LendIdle {
		c.lenderGone.Add(1)
	}
	if f := c.cfg.goneNoted; f != nil {
		f()
	}
}

// sweepGoneLocked takes out, at now, the waiters whose context has ended
// (goneLocked), wherever they stand in their queues — held by their
// tenant's running limit, behind a waiter that cannot start — as their own
// goroutines' ctxEnded would (decideGoneLocked: counted cancelled, or
// DEADLINE_EXPIRED when a deadline passed), but for the one ctxEnded is
// taking out itself (leaving). With look, it looks at the context of every
// waiter whose context can end (a virtual clock: the caller's next call
// must see the ending it caused, whatever the scheduler did); otherwise
// only in the classes where an ending has been noted (gone), so that it
// costs one atomic load per class while no caller has gone. It reports
// whether it took any out.
func (c *Controller) sweepGoneLocked(now time.Time, look bool) (took bool) {
	for _, cs := range c.classes {
		if look && cs.mortal == 0 || !look && cs.gone.Load() == 0 {
			continue
		}
		for w := cs.queue.head; w != nil; {
			next := w.next
			if w != c.leaving && goneLocked(w) {
				c.decideGoneLocked(w, now)
				took = true
			}
			w = next
		}
	}
	return took
}

// decideLocked runs the stages after the size check. It returns a permit, a
// queued waiter, or a refusal reason with its retry-after; and the requests
// of cs queued ahead of this one (0 for a permit, the queue it joined for a
// waiter, the queue it was refused at for a refusal).
func (c *Controller) decideLocked(r Request, cs *classState, now time.Time) (*Permit, *waiter, status.Reason, time.Duration, int) {
	// callerOnly marks a refusal that says nothing about load: the deadline
	// had passed on arrival, or could not be met even without waiting.
	callerOnly := false
	// heldByTenant: the request could start but for its own tenant's
	// running limit (acquire only looks). What follows from that — a wait,
	// a refusal — is the tenant's doing, not the server's overload.
	heldByTenant := false
	// tenantCaused marks a deadline refusal that its tenant's own running
	// work caused: no prediction of the class's was wrong, so later starts
	// cannot show it a false reject.
	tenantCaused := false
	// classFull marks a TENANT_LIMIT refusal that the class's lack of room
	// caused, not the tenant's own backlog: it counts as overload.
	classFull := false
	refuse := func(reason status.Reason) (*Permit, *waiter, status.Reason, time.Duration, int) {
		switch {
		case callerOnly:
			cs.refused[reason]++ // stats only: not an overload signal
		case classFull:
			cs.refused[reason]++
			if !c.stepped(cs) { // see countRefusal
				c.deg.refused(cs, status.ReasonQueueFull)
			}
		default:
			c.countRefusal(cs, reason)
		}
		var ra time.Duration
		switch reason {
		case status.ReasonDeadlineExpired, status.ReasonDraining:
		case status.ReasonDeadlineUnreachable:
			if !tenantCaused {
				c.rememberReject(cs, r.Deadline, r.StartBy, now)
			}
			ra = c.retryAfterLocked(cs, reason, now)
		case status.ReasonTenantLimit:
			// The tenant has room again when its first running request
			// ends; the class's wait counts too unless the class has a slot
			// free.
			next := c.tenantNextLocked(cs, r.Tenant, now)
			if !heldByTenant {
				next = max(next, c.retryBaseLocked(cs, reason, now))
			}
			ra = c.jitter(next)
		default:
			ra = c.retryAfterLocked(cs, reason, now)
		}
		ahead := cs.queue.n
		c.emitLocked(Event{Kind: EventRefused, Class: cs.cfg.Name, Tenant: r.Tenant, Reason: reason, At: now, QueuedAhead: ahead})
		return nil, nil, reason, ra, ahead
	}
	if c.closed && cs != c.control {
		// The control class stays open while the server drains: callers
		// resolve there the tries it ran (DESIGN.md §3.12).
		return refuse(status.ReasonDraining)
	}
	if cs.frozen || c.shedding(cs) {
		return refuse(status.ReasonShed)
	}
	// Waiters that can no longer finish hold no place — in the queue, in
	// their tenant's queue limits — that this request could take; and
	// whatever can start now (a lending class's queue may have emptied
	// since the last pump: a waiter that left on a virtual clock pumps
	// nothing) starts before this request, which comes after it.
	c.dropExpiredLocked(cs, now)
	c.pump(now)
	slots := c.slots(cs)
	tenantOn := c.cfg.stages&StageTenant != 0 && r.Tenant != "" &&
		(cs.cfg.TenantRunning > 0 || cs.cfg.TenantQueued > 0 || cs.cfg.TenantQueueWork > 0)
	var tc tenantCount
	if tenantOn {
		tc = cs.tenants[r.Tenant]
	}
	tenantMayRun := !tenantOn || cs.cfg.TenantRunning == 0 || tc.running < cs.cfg.TenantRunning
	var owner *classState
	if tenantMayRun {
		owner = c.acquire(cs, slots)
	}
	work := int64(cs.est.meanD())
	heldByTenant = !tenantMayRun && c.acquire(cs, slots) != nil
	if owner == nil && tenantOn {
		if (cs.cfg.TenantQueued > 0 && tc.queued >= cs.cfg.TenantQueued) ||
			(cs.cfg.TenantQueueWork > 0 && tc.work+work > int64(cs.cfg.TenantQueueWork)) {
			// A tenant with nothing waiting is refused only because one
			// request's learned work exceeds its bound, in a class with no
			// slot for it: no flood of its own, so the refusal counts as the
			// full class's overload (as QUEUE_FULL would), though it stays
			// TENANT_LIMIT, the bound being the tenant's.
			// (Not for a request that arrived expired: the caller's, in no
			// window.)
			classFull = tc.queued == 0 && tenantMayRun && (r.Deadline.IsZero() || !now.After(r.Deadline))
			return refuse(status.ReasonTenantLimit)
		}
		if heldByTenant && cs.queueCap == 0 && (r.Deadline.IsZero() || !now.After(r.Deadline)) {
			// Held back by its own tenant's running limit only, in a class
			// without a queue: it cannot wait, and a tenant over its limit
			// is not the server's overload — decided before the deadline
			// stage (unless the deadline has passed already), whose
			// predicted wait such a request would never have.
			return refuse(status.ReasonTenantLimit)
		}
	}
	// wait is the predicted wait of a request that finds no slot it may
	// take. One held back only by its tenant's running limit starts as its
	// tenant's running work ends (the class has a slot free: the waiters
	// ahead of it are held by their own tenants); one whose tenant is at
	// its limit in a full class waits for both.
	var wait, classWait, tenantWait time.Duration
	switch {
	case owner != nil:
	case heldByTenant:
		tenantWait = c.tenantStartWaitLocked(cs, r.Tenant, now)
		wait = tenantWait
	case !tenantMayRun:
		classWait = c.slotWaitLocked(cs, now) // acquire found no slot (heldByTenant)
		tenantWait = c.tenantStartWaitLocked(cs, r.Tenant, now)
		wait = max(classWait, tenantWait)
	default:
		classWait = c.slotWaitLocked(cs, now) // acquire found no slot (owner)
		wait = classWait
	}
	if c.cfg.stages&StageDeadline != 0 && !r.Deadline.IsZero() {
		if expiredAt(cs, r.Deadline, now) {
			callerOnly = true
			return refuse(status.ReasonDeadlineExpired)
		}
		svc := cs.est.service()
		if owner != nil && cs.running == 0 && cs.queue.n == 0 {
			// An idle class probes: only the configured expected service
			// time counts, so a stale or inflated estimate cannot refuse
			// every request forever; the probe's completion re-teaches it.
			svc = min(svc, cs.cfg.ExpectedServiceTime)
		}
		if now.Add(wait + svc + c.cfg.margin).After(r.Deadline) {
			// Overload only when the class's own wait made it too long (not
			// with no wait at all, nor for a request held back only by its
			// tenant's running limit); a false reject only if its tenant's
			// own running work did not (no start by the class could have
			// saved it then).
			callerOnly = wait == 0 || heldByTenant || !now.Add(classWait+svc+c.cfg.margin).After(r.Deadline)
			tenantCaused = tenantWait > 0 && now.Add(tenantWait+svc+c.cfg.margin).After(r.Deadline)
			return refuse(status.ReasonDeadlineUnreachable)
		}
	}
	if c.cfg.stages&StageDeadline != 0 && !r.StartBy.IsZero() && owner == nil && now.Add(wait).After(r.StartBy) {
		callerOnly = heldByTenant || !now.Add(classWait).After(r.StartBy)
		tenantCaused = tenantWait > 0 && now.Add(tenantWait).After(r.StartBy)
		return refuse(status.ReasonDeadlineUnreachable)
	}
	if owner != nil {
		p := c.startLocked(cs, owner, r.Tenant, tenantOn, r.Stream, r.Deadline, now, now, 0)
		c.emitLocked(Event{Kind: EventAdmitted, Class: cs.cfg.Name, Tenant: r.Tenant, At: now, Deadline: r.Deadline})
		return p, nil, 0, 0, 0
	}
	size := int64(max(r.Size, 0))
	switch {
	case cs.queueCap == 0:
		return refuse(status.ReasonConcurrencyFull)
	case cs.queue.n >= cs.queueCap, cs.cfg.QueueBytes > 0 && cs.queuedBytes+size > cs.cfg.QueueBytes:
		if heldByTenant {
			// The class has a slot free: only the tenant's own limit keeps
			// the request from it, whoever fills the queue.
			return refuse(status.ReasonTenantLimit)
		}
		return refuse(status.ReasonQueueFull)
	}
	w := &waiter{
		cs: cs, tenant: r.Tenant, tenantOn: tenantOn, stream: r.Stream, size: size, work: work,
		deadline: r.Deadline, enq: now, ready: make(chan struct{}),
		predicted: wait, ahead: cs.queue.n,
	}
	if c.tenantHeld(cs, w) {
		cs.heldWaiters++
	}
	cs.queue.push(w)
	cs.queuedBytes += size
	cs.queuedWork += work
	c.queued++
	if tenantOn {
		tc.queued++
		tc.work += work
		cs.tenants[r.Tenant] = tc
	}
	c.emitLocked(Event{Kind: EventQueued, Class: cs.cfg.Name, Tenant: r.Tenant, At: now, QueuedAhead: w.ahead})
	return nil, w, 0, 0, w.ahead
}

// wait blocks until w is granted or dropped, or ctx ends. With timed (the
// real clock, and the dequeue stage on), w also gives up by itself once it
// can no longer finish by its deadline (its deadline less the class's
// service estimate, re-read when the timer fires and when a release at
// least doubles the estimate — classState.rose): it is dropped then,
// DEADLINE_EXPIRED, rather than left to wait until its caller's context ends
// — the caller hears an honest refusal while it still listens, and the
// place it held in the queue (which the tap sees) is free at once. Without
// it, such a waiter is dropped only when a slot frees or a new request
// arrives. A waiter whose context has ended by then is its caller's:
// ctxEnded ends its wait, never the give-up.
func (c *Controller) wait(ctx context.Context, w *waiter, timed bool) (*Permit, error) {
	if timed && c.cfg.stages&StageDequeue != 0 && !w.deadline.IsZero() {
		c.mu.Lock()
		at := w.deadline.Add(-w.cs.est.service())
		rose := w.cs.rose
		c.mu.Unlock()
		timer := time.NewTimer(time.Until(at) + time.Millisecond)
		defer timer.Stop()
		for {
			select {
			case <-w.ready:
				return c.woken(ctx, w)
			case <-ctx.Done():
				return c.ctxEnded(ctx, w)
			case <-rose:
				// The estimate rose: re-arm by it, or give up now.
				c.mu.Lock()
				rose = w.cs.rose
				c.mu.Unlock()
			case <-timer.C:
			}
			c.mu.Lock()
			if ctx.Err() != nil {
				// Its context ended as well (the select saw the timer or
				// the rise first, or the context ended since): its caller
				// has gone, and the wait ends ctxEnded's way — a cancelled
				// caller is no give-up of the queue's, and time-driven
				// state must not start a waiter whose client has left.
				c.mu.Unlock()
				return c.ctxEnded(ctx, w)
			}
			now := c.cfg.now()
			c.advance(now) // time-driven state first: it may start w
			if w.decided {
				c.unlock()
				return c.woken(ctx, w)
			}
			if c.expiredLocked(w.cs, w, now) {
				c.dropWaiter(w, status.ReasonDeadlineExpired, 0, now)
				c.pump(now) // as in ctxEnded: a lender's idle slot may be free now
				c.unlock()
				return c.woken(ctx, w)
			}
			at = w.deadline.Add(-w.cs.est.service()) // the estimate moved since
			c.unlock()
			timer.Reset(time.Until(at) + time.Millisecond)
		}
	}
	select {
	case <-w.ready:
		return c.woken(ctx, w)
	case <-ctx.Done():
		return c.ctxEnded(ctx, w)
	}
}

// ctxEnded ends w's wait because ctx ended, unless w was decided as it
// did.
func (c *Controller) ctxEnded(ctx context.Context, w *waiter) (*Permit, error) {
	c.mu.Lock()
	if w.decided {
		// Decided as ctx ended: the decision stands (a granted permit is
		// the caller's to release).
		c.mu.Unlock()
		return c.woken(ctx, w)
	}
	now := c.nowLocked()
	if !c.virtual {
		// Close the windows that ended while w waited first, as the give-up
		// timer does: each sees w still waiting (oldestWait), and its wait
		// counts in the window it leaves in, not clamped to the end of the
		// oldest one still open. Time-driven state may take w out (a shed,
		// a trim: as its context says, dropWaiterCounted), but never start
		// it, nor drop it as unable to finish: its client is gone, its
		// refusal is its context's (below), and the slot is the next
		// waiter's (pumpPass skips it).
		c.leaving = w
		c.advance(now)
		c.leaving = nil
		if w.decided {
			c.unlock()
			return c.woken(ctx, w)
		}
	}
	reason, final, ra := c.leaveLocked(ctx, w, now)
	// Leaving the queue may free a lender's idle slot for another class's
	// waiter: start what can start, on the controller's own clock (the
	// real one, or WithClock's), whichever path ended the wait. A virtual
	// clock's time is the caller's to give (AdmitAt, ReleaseAt): its pumps
	// wait for the caller's next call.
	if !c.virtual {
		c.pump(now)
	}
	c.unlock()
	if reason == status.ReasonDeadlineExpired {
		c.m.missDequeueAdd(ctx) // expired while waiting
		c.m.refused(ctx, w.cs, reason)
	} else {
		c.m.cancelled(ctx, w.cs)
	}
	return nil, waitEnded(reason, w.cs, ctx.Err(), ra, final)
}

// leaveLocked takes waiter w, whose context ctx has ended, out of its
// queue at now, as its context's ending says, and counts it: DEADLINE_EXPIRED
// when a deadline passed (deadlineEnded), with whether that refusal is final
// and the delay it suggests; UNSPECIFIED when its caller went away (counted
// cancelled). It pumps nothing: its caller does, when it may.
func (c *Controller) leaveLocked(ctx context.Context, w *waiter, now time.Time) (reason status.Reason, final bool, ra time.Duration) {
	c.noteLeftWaitLocked(w, now)
	reason = status.ReasonUnspecified
	if deadlineEnded(ctx, w.deadline, now) {
		// Its caller's deadline passed while it waited: the queue held it
		// too long, a refusal like the dequeue stage's, and counted as it
		// (no overload if it ran out of time under Recovering's step).
		reason = status.ReasonDeadlineExpired
		c.countDropLocked(w.cs, reason, !c.heldByTenantLocked(w) && !expiredUnderStep(w))
	} else {
		// Canceled: its caller went away. The server refused nothing, and
		// a client giving up is no sign of health either: a decision of
		// its own (cancelled), in no degradation window.
		w.cs.cancelled++
	}
	c.removeWaiter(w)
	if reason == status.ReasonDeadlineExpired {
		final, ra = c.expiredRefusalLocked(w.cs, w.deadline, now) // the queue it leaves
	}
	c.emitLocked(Event{Kind: EventDropped, Class: w.cs.cfg.Name, Tenant: w.tenant, Reason: reason, At: w.enq})
	return reason, final, ra
}

// expireLocked drops waiter w, which can no longer finish by its
// deadline at now (expiredLocked), unrun with DEADLINE_EXPIRED — unless its
// context has ended: its caller's then, it leaves as its context's ending
// says (leaveLocked), as it would had its own goroutine run ctxEnded first,
// so that a caller that went away is counted and told cancelled, not a
// deadline drop, whichever call finds it (a release, an arrival, Stats).
// Its goroutine, woken, reports what was decided.
func (c *Controller) expireLocked(w *waiter, now time.Time) {
	if !goneLocked(w) {
		c.dropWaiter(w, status.ReasonDeadlineExpired, 0, now)
		return
	}
	c.decideGoneLocked(w, now)
}

// goneLocked reports whether waiter w's context has ended: its caller's,
// which its own goroutine may not have seen yet.
func goneLocked(w *waiter) bool {
	return w.ctx != nil && w.ctx.Err() != nil
}

// decideGoneLocked decides waiter w, whose context has ended (goneLocked),
// at now as its own goroutine's ctxEnded would have: it leaves its queue as
// its context's ending says (leaveLocked), counted there once; its
// goroutine, woken, reports it (and counts its metrics).
func (c *Controller) decideGoneLocked(w *waiter, now time.Time) {
	reason, final, ra := c.leaveLocked(w.ctx, w, now)
	w.reason, w.cancelled = reason, reason == status.ReasonUnspecified
	w.err = waitEnded(reason, w.cs, w.ctx.Err(), ra, final)
	w.decided = true
	close(w.ready)
}

// expiredRefusalLocked returns whether the DEADLINE_EXPIRED refusal of a
// request of cs with deadline, whose context ended by a deadline at now,
// is final, and the delay it suggests. It is final, suggesting none, when
// the request's own deadline has expired (expiredAt), as the arrival and
// dequeue stages' refusals are: no repeat within the attempt can meet a
// deadline that has passed. A context that ended by a deadline of its own
// before the request's (a per-try timeout) leaves the request's deadline to
// a repeat: not final, with a delay that reflects the queue.
func (c *Controller) expiredRefusalLocked(cs *classState, deadline, now time.Time) (final bool, ra time.Duration) {
	if !deadline.IsZero() && expiredAt(cs, deadline, now) {
		return true, 0
	}
	return false, c.retryAfterLocked(cs, status.ReasonDeadlineExpired, now)
}

// unmeetableLocked reports whether no repeat of a request of cs could meet
// deadline from now, so that its DEADLINE_EXPIRED refusal is final: the
// deadline has passed (expiredAt), or even the plan most favourable to a
// repeat — an idle class's probe, which counts min(estimate, expected)
// (decideLocked) — would finish after it. A waiter the learned estimate
// drops while a repeat could still be admitted (an inflated estimate, an
// expected time that fits) is refused not final: the drop is then a
// prediction, as the arrival's DEADLINE_UNREACHABLE is.
func (c *Controller) unmeetableLocked(cs *classState, deadline, now time.Time) bool {
	if deadline.IsZero() {
		return false
	}
	probe := min(cs.est.service(), cs.cfg.ExpectedServiceTime)
	return expiredAt(cs, deadline, now) || now.Add(probe+c.cfg.margin).After(deadline)
}

// deadlineEnded reports whether ctx, which has ended, ended because a
// deadline passed rather than because its caller went away: its error or
// its cause (context.Cause) is context.DeadlineExceeded; or it was
// canceled once its own deadline had passed (by the wall clock, which
// contexts keep) or the request's deadline had (by the controller's clock,
// now) — a gRPC server's context is canceled by the client's RST_STREAM
// when the client's deadline passes, which often comes before the
// server's own timer for the same deadline fires, and a context canceled
// in the instant between its deadline and its timer reports
// context.Canceled too.
func deadlineEnded(ctx context.Context, deadline, now time.Time) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return true
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return true
	}
	return !deadline.IsZero() && !now.Before(deadline)
}

// woken turns a decided waiter into Admit's result.
func (c *Controller) woken(ctx context.Context, w *waiter) (*Permit, error) {
	if w.err != nil {
		if w.cancelled {
			c.m.cancelled(ctx, w.cs) // its caller went away (expireLocked)
			return nil, w.err
		}
		reason := w.reason
		if reason == status.ReasonDeadlineExpired {
			c.m.missDequeueAdd(ctx)
		}
		c.m.refused(ctx, w.cs, reason)
		return nil, w.err
	}
	waited := w.permit.start.Sub(w.enq)
	c.m.admitted(ctx, w.cs, waited)
	c.m.predictionError(ctx, w.cs, waited-w.predicted)
	return w.permit, nil
}

// slots is the number of slots class cs may use now: its configured slots,
// lowered by overrides, by freezing and by shedding or stepped re-admission
// of optional classes.
func (c *Controller) slots(cs *classState) int {
	if cs.frozen {
		return 0
	}
	n := cs.slotsCap
	if cs.cfg.Optional {
		switch c.mode() {
		case ModeDegraded:
			return 0
		case ModeRecovering:
			x := c.cfg.degradation.ExitAfter
			h := min(max(c.deg.healthy, 1), x)
			n = max((n*h+x-1)/x, 1)
		}
	}
	return n
}

// noteSteps notes, at at, which classes Recovering's step holds below their
// slots (stepped), after the mode or the limits changed: a class released
// from the step at at counts its waits in the windows only from then.
func (c *Controller) noteSteps(at time.Time) {
	for _, cs := range c.classes {
		st := c.stepped(cs)
		if cs.wasStepped && !st {
			cs.unsteppedAt = at
		}
		cs.wasStepped = st
	}
}

// waiting reports whether a request of any class waits.
func (c *Controller) waiting() bool {
	for _, cs := range c.classes {
		if cs.queue.n > 0 {
			return true
		}
	}
	return false
}

// awake is wake's function: it brings the state up to date, which starts
// the waiters an expired override or a new step lets start, and arms wake
// again while requests wait and time alone will change the state.
func (c *Controller) awake() {
	c.mu.Lock()
	c.wakeAt = 0
	if c.closed || c.virtual {
		// Closed; or driven on a virtual clock since the timer was
		// armed, whose time the wall clock says nothing of.
		c.mu.Unlock()
		return
	}
	c.advance(c.cfg.now())
	c.unlock()
}

// stepped reports whether cs is an optional class that Recovering's
// stepped re-admission holds below its slots: its refusals are the
// controller's own doing, as shedding's are, and no sign of overload —
// counted, they would make every Recovering window overloaded whenever
// the optional load needs more than the first step, and the controller
// would never return to Normal.
func (c *Controller) stepped(cs *classState) bool {
	return cs.cfg.Optional && c.mode() == ModeRecovering && c.slots(cs) < cs.slotsCap
}

// acquire returns the class whose slot a request of cs may take now: cs's
// own, else an idle slot of a class that lends and has no waiters; nil when
// none is free. A class whose slots are lowered (override, Recovering) borrows
// only while fewer of its requests than its lowered slots run.
func (c *Controller) acquire(cs *classState, slots int) *classState {
	if slots < cs.cfg.Slots && cs.running >= slots {
		// Lowered by an override or Recovering's step (or frozen, shed):
		// neither its own slots freed by borrowers nor borrowing may lift
		// the class past its lowered limit.
		return nil
	}
	if cs.used < slots {
		return cs
	}
	if cs.frozen || c.shedding(cs) {
		return nil
	}
	for _, l := range c.classes {
		if l != cs && l.cfg.LendIdle && l.queue.n == 0 && l.used < c.slots(l) {
			return l
		}
	}
	return nil
}

// startLocked accounts a request that starts running now; ahead is the
// requests of cs that were queued ahead of it when it was decided.
func (c *Controller) startLocked(cs, owner *classState, tenant string, tenantOn, stream bool, deadline, arrived, now time.Time, ahead int) *Permit {
	// Callers read the clock before taking the lock, so a releaser's time
	// may precede the arrival it starts: never start before arriving.
	now = maxTime(now, arrived)
	owner.used++
	cs.running++
	if c.cfg.check != nil {
		c.checkStart(cs, owner)
	}
	off := float64(now.Sub(c.epoch))
	if tenantOn {
		tc := cs.tenants[tenant]
		tc.running++
		if tc.running == cs.cfg.TenantRunning {
			cs.heldWaiters += tc.queued // its waiters are held from now on
		}
		cs.tenants[tenant] = tc
	} else {
		tenant = ""
	}
	cs.admitted++
	if !c.stepped(cs) { // a wait Recovering's step caused is no overload signal
		c.deg.started(cs, now.Sub(maxTime(arrived, cs.unsteppedAt)))
	}
	c.judgeRejects(cs, arrived, now)
	p := &Permit{c: c, cs: cs, owner: owner, tenant: tenant, start: now, startOff: off, deadline: deadline, ahead: ahead, stream: stream, virtual: c.virtual}
	if !deadline.IsZero() {
		p.endOff = float64(deadline.Sub(c.epoch))
	}
	p.next = cs.runHead
	if cs.runHead != nil {
		cs.runHead.prev = p
	}
	cs.runHead = p
	return p
}

// releaseLocked returns p's slot and starts waiters that can run. observe
// is false when the permit was abandoned: the request never ran or its
// lifetime is no service time, so the estimator learns nothing and no false
// accept is counted. judge is set when it ran: a finish after its deadline
// is a false accept (unset as well by a plain Release whose start and
// time are on different clocks); observe then also teaches the class its
// service time, now less the start (unset by a plain Release whose time,
// or start, was not on the controller's own clock: see Release), as a
// lower bound when it finished after its deadline (the deadline cut its
// handler, most likely: estimator.observe). It reports whether the request
// finished after its deadline.
func (c *Controller) releaseLocked(p *Permit, now time.Time, observe, judge bool) (late bool) {
	cs := p.cs
	if judge && !p.deadline.IsZero() && now.After(p.deadline) {
		cs.falseAccepts++
		late = true
	}
	if observe {
		cs.est.observe(now.Sub(p.start), p.startOff, late)
		switch svc := cs.est.service(); {
		case svc >= 2*cs.roseAt && svc > 0:
			if cs.queue.n > 0 {
				close(cs.rose)
				cs.rose = make(chan struct{})
			}
			cs.roseAt = svc
		case svc < cs.roseAt:
			cs.roseAt = svc
		}
	}
	if c.cfg.stages&StageTenant != 0 {
		// Waiters that can no longer finish (by the estimate this release
		// just taught) are dropped as they stand, before the release frees
		// what they waited for: a waiter whose own tenant's work ended late
		// is judged in the state it waited in (heldByTenantLocked). This in
		// every class with tenant limits, since a release in any class can
		// free a slot (its own, a borrowed one, a lender's idle one) that
		// such a waiter would then seem to have had.
		for _, k := range c.classes {
			if k.cfg.TenantRunning > 0 {
				c.dropExpiredLocked(k, now)
			}
		}
	}
	if observe && (c.cfg.stages&StageTenant == 0 || cs.cfg.TenantRunning == 0) {
		// The estimate this release taught may leave waiters of its class
		// unable to finish anywhere in its queue, where pump's walk, which
		// stops at the first waiter that cannot start, would not reach
		// them, and their timers (armed by the old estimate) would fire
		// late: drop them now.
		c.dropExpiredLocked(cs, now)
	}
	p.owner.used--
	cs.running--
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		cs.runHead = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	}
	p.prev, p.next = nil, nil
	if p.tenant != "" {
		tc := cs.tenants[p.tenant]
		if tc.running == cs.cfg.TenantRunning {
			cs.heldWaiters -= tc.queued // its waiters may start again
		}
		tc.running--
		c.putTenant(cs, p.tenant, tc)
	}
	c.emitLocked(Event{Kind: EventReleased, Class: cs.cfg.Name, Tenant: p.tenant, At: now})
	c.pump(now)
	return late
}

func (c *Controller) putTenant(cs *classState, tenant string, tc tenantCount) {
	if tc.running == 0 && tc.queued == 0 {
		delete(cs.tenants, tenant)
		return
	}
	cs.tenants[tenant] = tc
}

// pump starts waiting requests while slots allow, in class order, FIFO
// within a class, skipping requests whose tenant is at its running limit,
// dropping, with DEADLINE_EXPIRED, those that can no longer finish by
// their deadline, and taking out, as their contexts' endings say
// (decideGoneLocked), those it would start whose callers have gone.
func (c *Controller) pump(now time.Time) {
	// A lending class whose queue empties during a pass starts lending its
	// idle slots, which a class met earlier in the pass may be waiting for:
	// pass again then (at most once per lending class, since nothing joins
	// a queue here).
	for again := true; again && c.queued > 0; {
		again = c.pumpPass(now)
	}
}

// pumpPass is one pass of pump over the classes, in order; it reports
// whether a lending class's queue emptied.
func (c *Controller) pumpPass(now time.Time) (lenderEmptied bool) {
	for _, cs := range c.classes {
		if cs.queue.n == 0 || (!c.mayHaveExpiredLocked(cs, now) &&
			(cs.heldWaiters == cs.queue.n || c.acquire(cs, c.slots(cs)) == nil)) {
			// Nothing of cs can start, nor be dropped: the walk below would
			// only skip waiters held by their tenant and stop at the first
			// that is not, having done nothing.
			continue
		}
		// A walk that reaches the queue's end has seen every waiter left:
		// it sets the queue's deadline bound exactly, as dropExpiredLocked
		// does, so that a bound left early by a waiter that has gone does
		// not have every later pump walk the queue again.
		var soonest time.Time
		whole := true
		for w := cs.queue.head; w != nil; {
			next := w.next
			if w != c.leaving && c.expiredLocked(cs, w, now) {
				// (A leaving waiter's caller has gone: ctxEnded refuses
				// it as its context's ending says, not as the queue's
				// give-up; expireLocked does so for one whose context
				// ended before its goroutine got here.)
				c.expireLocked(w, now)
				w = next
				continue
			}
			if w == c.leaving || c.tenantHeld(cs, w) {
				// Leaving (its context ended: ctxEnded), or held by its
				// tenant's running limit: those behind it may start.
				soonest = sooner(soonest, w.deadline)
				w = next
				continue
			}
			if goneLocked(w) {
				// Its caller has gone, though its goroutine has not yet
				// seen it: a slot for it would be no one's, and the
				// decision would stand. It leaves as its context says,
				// and those behind it may start.
				c.decideGoneLocked(w, now)
				w = next
				continue
			}
			owner := c.acquire(cs, c.slots(cs))
			if owner == nil {
				whole = false
				break
			}
			c.removeWaiter(w)
			w.permit = c.startLocked(cs, owner, w.tenant, w.tenantOn, w.stream, w.deadline, w.enq, now, w.ahead)
			w.decided = true
			close(w.ready)
			c.emitLocked(Event{Kind: EventStarted, Class: cs.cfg.Name, Tenant: w.tenant, At: now, Deadline: w.deadline, Waited: now.Sub(w.enq)})
			w = next
		}
		if whole && c.cfg.stages&StageDequeue != 0 {
			cs.queue.soonest = soonest
		}
		if cs.queue.n == 0 && cs.cfg.LendIdle {
			lenderEmptied = true // it was not empty: the pass skips empty queues
		}
	}
	return lenderEmptied
}

// tenantHeld reports whether waiter w of cs is held by its tenant's
// running limit: whether its tenant runs TenantRunning requests of cs.
func (c *Controller) tenantHeld(cs *classState, w *waiter) bool {
	return w.tenantOn && cs.cfg.TenantRunning > 0 && cs.tenants[w.tenant].running >= cs.cfg.TenantRunning
}

// expiredAt reports whether a request of cs with deadline d has expired at
// now: past d, or at d while the class's service time is unknown (no
// ExpectedServiceTime, nothing learned), whose 0 would otherwise start work
// with no time left. A known service time, even a learned 0, decides by
// itself at d: a job that would finish exactly at its deadline is still
// useful (DESIGN.md §3.9).
func expiredAt(cs *classState, d, now time.Time) bool {
	return now.After(d) || (now.Equal(d) && cs.est.unknown())
}

// expiredLocked reports whether waiter w of cs is expired for its purpose
// (with the dequeue stage on): expired (expiredAt), or unable to finish by
// its deadline (a job that would finish exactly at it still starts).
func (c *Controller) expiredLocked(cs *classState, w *waiter, now time.Time) bool {
	return c.cfg.stages&StageDequeue != 0 && !w.deadline.IsZero() &&
		(expiredAt(cs, w.deadline, now) || now.Add(cs.est.service()).After(w.deadline))
}

// mayHaveExpiredLocked reports whether a waiter of cs may be expired for
// its purpose: whether the queue's earliest deadline, or the bound kept of
// it, is (expiredLocked). When it reports false, none is.
func (c *Controller) mayHaveExpiredLocked(cs *classState, now time.Time) bool {
	s := cs.queue.soonest
	return c.cfg.stages&StageDequeue != 0 && !s.IsZero() && (expiredAt(cs, s, now) || now.Add(cs.est.service()).After(s))
}

// dropExpiredLocked drops, unrun with DEADLINE_EXPIRED, the waiters of cs
// that are expired for their purpose, and sets the queue's bound on its
// earliest deadline exactly. A queue that cannot hold one is not walked.
func (c *Controller) dropExpiredLocked(cs *classState, now time.Time) {
	if !c.mayHaveExpiredLocked(cs, now) {
		return
	}
	var soonest time.Time
	for w := cs.queue.head; w != nil; {
		next := w.next
		if c.expiredLocked(cs, w, now) {
			c.expireLocked(w, now)
		} else {
			soonest = sooner(soonest, w.deadline)
		}
		w = next
	}
	cs.queue.soonest = soonest
}

// removeWaiter takes w out of its queue and the tenant's accounts.
func (c *Controller) removeWaiter(w *waiter) {
	cs := w.cs
	if c.tenantHeld(cs, w) {
		cs.heldWaiters--
	}
	if w.state.Swap(waiterOut) == waiterGone {
		cs.gone.Add(-1)
		if cs.cfg.LendIdle {
			c.lenderGone.Add(-1)
		}
	}
	if w.mortal {
		cs.mortal--
		c.mortal--
	}
	cs.queue.remove(w)
	cs.queuedBytes -= w.size
	cs.queuedWork -= w.work
	c.queued--
	if w.tenantOn {
		tc := cs.tenants[w.tenant]
		tc.queued--
		tc.work -= w.work
		c.putTenant(cs, w.tenant, tc)
	}
}

// dropWaiter refuses a waiting request without running it.
func (c *Controller) dropWaiter(w *waiter, reason status.Reason, ra time.Duration, now time.Time) {
	c.dropWaiterCounted(w, reason, ra, now, !c.heldByTenantLocked(w))
}

// heldByTenantLocked reports whether waiter w waits, now, only for its own
// tenant's running work: its tenant is at its running limit while its
// class could start it (acquire only looks). Its refusal is then the
// tenant's doing, not the server's overload. A release drops the expired
// waiters of every tenant-limited class before it frees its slot
// (releaseLocked), so that a waiter whose own tenant's work ends late is
// judged as it waited.
func (c *Controller) heldByTenantLocked(w *waiter) bool {
	return c.tenantHeld(w.cs, w) && c.acquire(w.cs, c.slots(w.cs)) != nil
}

// tenantStartWaitLocked estimates how long a new request of tenant, held
// back by its tenant's running limit, waits before it starts: the tenant's
// queued requests start before it, each on the first of the tenant's slots
// to free (its running requests' remainders, Permit.remaining), taking the
// mean there; it starts on the first slot free after them. A stream's end
// is guessed only when streams are all the tenant runs (nothing else could
// free one of its slots).
func (c *Controller) tenantStartWaitLocked(cs *classState, tenant string, now time.Time) time.Duration {
	mean := cs.est.mean
	nowOff := float64(now.Sub(c.epoch))
	guess := c.onlyStreamsLocked(cs, tenant)
	var buf [8]float64
	rem := buf[:0]
	for p := cs.runHead; p != nil; p = p.next {
		if p.tenant == tenant {
			rem = append(rem, p.remaining(mean, nowOff, guess))
		}
	}
	if len(rem) == 0 {
		return 0
	}
	// The tenant's queued requests start first, each on the first of its
	// slots to free, and take the mean there; the new request starts on
	// the first slot free after them. The remainders differ (a stream's is
	// long), so the starts are played out rather than assumed in rounds.
	slices.Sort(rem)
	return waitOf(nextStart(rem, 0, cs.tenants[tenant].queued, mean))
}

// onlyStreamsLocked reports whether every request tenant runs in cs is a
// stream: only their ends can free one of its slots, and a stream's end is
// then guessed (Permit.remaining).
func (c *Controller) onlyStreamsLocked(cs *classState, tenant string) bool {
	for p := cs.runHead; p != nil; p = p.next {
		if p.tenant == tenant && !p.stream {
			return false
		}
	}
	return true
}

// nextStart is when the (n+1)-th of requests that each take w start on
// idle slots free now and slots that free at the sorted times free (each
// slot taking one request at a time from when it frees): the start of a
// request with n queued ahead of it. It searches the time rather than
// stepping through the queue, so it costs a pass over the slots per step
// of the search, and allocates nothing.
func nextStart(free []float64, idle, n int, w float64) float64 {
	first := free[0]
	if idle > 0 {
		first = 0
	}
	if n <= 0 || w <= 0 || math.IsInf(first, 1) {
		return first // (+Inf: no slot ever frees)
	}
	starts := func(at float64) int {
		k := idle * (int(at/w) + 1)
		for _, f := range free {
			if at >= f {
				k += int((at-f)/w) + 1
			}
		}
		return k
	}
	lo, hi := first, first+float64(n)*w // all on the first slot to free
	for range 60 {
		mid := (lo + hi) / 2
		if starts(mid) >= n+1 {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// countDropLocked counts the refusal of a waiter of cs in the class's stats
// and, when overload is true, in the degradation window too.
func (c *Controller) countDropLocked(cs *classState, reason status.Reason, overload bool) {
	if overload {
		c.countRefusal(cs, reason)
	} else {
		cs.refused[reason]++
	}
}

// dropWaiterCounted is dropWaiter; overload says whether the refusal counts
// in the degradation window (false: an operator's doing, not load). A
// waiter whose context has ended (goneLocked) is refused nothing, whatever
// the reason: its caller has gone, and it leaves as its context's ending
// says (decideGoneLocked), as its own goroutine's ctxEnded would have it —
// a shed, a trim or Close does not count or tell a client's going away as
// its refusal.
func (c *Controller) dropWaiterCounted(w *waiter, reason status.Reason, ra time.Duration, now time.Time, overload bool) {
	if goneLocked(w) {
		c.decideGoneLocked(w, now)
		return
	}
	c.removeWaiter(w)
	if overload && reason == status.ReasonDeadlineExpired && expiredUnderStep(w) {
		overload = false
	}
	if overload && reason == status.ReasonDeadlineExpired {
		c.noteLeftWaitLocked(w, now)
	}
	c.countDropLocked(w.cs, reason, overload)
	final := false
	if reason == status.ReasonDeadlineExpired {
		final = c.unmeetableLocked(w.cs, w.deadline, now)
		if !final {
			ra = c.retryAfterLocked(w.cs, reason, now)
		}
	}
	w.reason = reason
	w.err = refusal(w.cs, reason, ra, final)
	w.decided = true
	close(w.ready)
	c.emitLocked(Event{Kind: EventDropped, Class: w.cs.cfg.Name, Tenant: w.tenant, Reason: reason, At: now, Deadline: w.deadline})
}

// expiredUnderStep reports whether waiter w could no longer finish by its
// deadline while Recovering's step still held its class: its
// DEADLINE_EXPIRED is the step's doing, no overload, though it comes after
// the step ended (a window roll steps before it drops, or before the
// waiter's leaving is counted; see stepped).
func expiredUnderStep(w *waiter) bool {
	return !w.deadline.IsZero() && !w.deadline.Add(-w.cs.est.service()).After(w.cs.unsteppedAt)
}

// noteLeftWaitLocked counts against MaxQueueAge the wait of waiter w, which
// leaves its queue unrun at now because its context ended or it can no
// longer finish: its age as the current window's end would have seen it had
// it stayed (oldestWait), at now or at the window's end if that came first.
// As in oldestWait, a waiter held back only by its own tenant's running
// limit, or of a class Recovering's step holds, counts nothing, and the
// part of its wait before the step ended is the step's. Call it before
// removing w.
func (c *Controller) noteLeftWaitLocked(w *waiter, now time.Time) {
	cs := w.cs
	if c.stepped(cs) || c.heldByTenantLocked(w) {
		return
	}
	at := now
	if c.deg.winEnd.Before(at) {
		at = c.deg.winEnd
	}
	c.deg.waited(cs, at.Sub(maxTime(w.enq, cs.unsteppedAt)))
}

// countRefusal counts a refusal for the class's stats and the window (not
// the window's when the refusal is Recovering's step's: see stepped).
func (c *Controller) countRefusal(cs *classState, reason status.Reason) {
	cs.refused[reason]++
	if !c.stepped(cs) {
		c.deg.refused(cs, reason)
	}
}

// overdueShare is the share of the learned mean a running request that has
// outrun the mean is still expected to need.
const overdueShare = 0.1

// remaining is how long running request p is expected to hold its slot
// still, at nowOff, in a class whose learned mean is mean: the mean less its
// elapsed time, but at least overdueShare of the mean. A stream's lifetime
// the mean says nothing of: it ends at its deadline, where its handler's
// context ends, and one without a deadline is not expected to end (+Inf) —
// unless guess, when it is expected to live as long again as it has lived,
// and at least the mean (a stream that has lived long is likely to live
// long), but no later than its deadline. Callers guess only when nothing
// but streams could free a slot (streams hold every slot), never to put a
// start on a made-up end while other slots free.
func (p *Permit) remaining(mean, nowOff float64, guess bool) float64 {
	age := nowOff - p.startOff
	if p.stream {
		r := math.Inf(1)
		if guess {
			r = max(age, mean)
		}
		if p.endOff != 0 {
			r = min(r, p.endOff-nowOff)
		}
		// Past its deadline and still running (a handler that ignores its
		// context): overdue, as a unary request past the mean.
		return max(r, mean*overdueShare)
	}
	return max(mean-age, mean*overdueShare)
}

// predictedWaitLocked is the wait of a request of cs arriving now (one its
// tenant's limits do not hold back): 0 when a slot it may take is free and
// no waiter of the class can take it first (it starts at once); else
// slotWaitLocked's, or, while nothing is known of the class's service time,
// at least unknownWaitLocked's. Stats and retry-afters ask it; a decision,
// which asks only when no slot is free, asks slotWaitLocked.
func (c *Controller) predictedWaitLocked(cs *classState, now time.Time) time.Duration {
	if cs.queue.n == cs.heldWaiters && c.acquire(cs, c.slots(cs)) != nil {
		// A slot it may take is free (its own, or one lent), and no waiter
		// of the class that could take it first: a request arriving now
		// starts at once, as decideLocked would start it. Spread over the
		// slots, the running work would say a wait nobody has.
		return 0
	}
	w := c.slotWaitLocked(cs, now)
	if cs.est.unknown() {
		w = max(w, c.unknownWaitLocked(cs, now))
	}
	return w
}

// unknownWaitLocked is the wait of a request of cs that finds no free slot
// while nothing is known of the class's service time (no
// ExpectedServiceTime, no release has taught one), where slotWaitLocked,
// with a mean of 0, would say none. The time a running request has run is
// a lower bound of its service time, and with nothing else to go by it is
// expected to run as long again, but not past its deadline (guessLeft);
// each waiter is expected to take the running requests' average run so
// far. That work — the running unary requests' of the class and the
// queue's — is spread over the class's slots that its streams do not hold:
// a stream holds its slot for its lifetime, so its age is no work another
// slot shares (as in slotWaitLocked; one on a borrowed slot holds none of
// the class's, unless the class is lowered). While only streams run, each
// is expected to live as long again as it has (no later than its
// deadline), the first to end frees a slot, and the queue's work, at the
// streams' average age each, is spread over the slots. Only Stats'
// PredictedWait and the retry-afters use it: the deadline stage, which
// cannot judge work of unknown length, still admits it (see Admit).
func (c *Controller) unknownWaitLocked(cs *classState, now time.Time) time.Duration {
	slots := max(c.slots(cs), 1)
	lowered := slots < cs.cfg.Slots
	nowOff := float64(now.Sub(c.epoch))
	var work, ran, streamRan float64
	first := math.Inf(1) // the soonest guessed end of a stream holding a slot
	n, streams := 0, 0
	for p := cs.runHead; p != nil; p = p.next {
		age := max(nowOff-p.startOff, 0)
		if p.stream {
			if p.owner == cs || lowered {
				streams++
				streamRan += age
				first = min(first, p.guessLeft(nowOff))
			}
			continue
		}
		work += p.guessLeft(nowOff)
		ran += age
		n++
	}
	q := float64(cs.queue.n)
	switch {
	case n > 0:
		return waitOf((work + q*ran/float64(n)) / float64(max(slots-streams, 1)))
	case streams > 0:
		return waitOf(first + q*streamRan/float64(streams)/float64(slots))
	}
	return 0
}

// guessLeft is how long running request p, of a class that knows nothing
// of its service time, is expected to run still at nowOff: as long again
// as it has run, but no later than its deadline, where its handler's
// context ends (0 once that has passed).
func (p *Permit) guessLeft(nowOff float64) float64 {
	g := max(nowOff-p.startOff, 0)
	if p.endOff != 0 {
		g = min(g, max(p.endOff-nowOff, 0))
	}
	return g
}

// slotWaitLocked is the wait of a request of cs that finds no free slot it
// may take: the work queued ahead plus what
// remains of the running work of the class, spread over the class's slots. A running stream holds its slot for
// its lifetime, which may end soon (at its deadline) or late: while one
// holds a slot of the class, and while a lowered class runs more requests
// than its slots (none starts until enough end, which spreading their work
// over the slots would put too late), the slots free only as the requests
// on them end (playOutLocked), a stream at its deadline, or never without
// one: its lifetime is guessed (Permit.remaining) only while streams hold
// every slot, or when the play-out finds no other end to start on. Each
// running request's remainder is
// clamped on its own: the
// learned mean minus its elapsed time, but at least overdueShare of the mean, so that an overdue request neither hides the
// others' remaining work nor makes a full class predict no wait. Requests
// of other classes that borrowed this class's slots count too, with their
// own class's mean: a class that lent every slot is full, and its next
// request waits for a borrower to end. Finding them costs a pass over the
// running requests of every class, only while this class lends.
//
// A tenant at its running limit with requests waiting (saturated) can
// start none of them until one of its own requests ends, and then one of
// its own waiters may take the slot: its running and queued work are left
// out of another tenant's wait, and so are the slots it holds —
// unless such tenants hold every slot, or the class lends or borrows a
// slot now (its slots and its running requests are then not the same
// set), when the work of all is spread over all slots. It costs one pass
// over the class's running requests: a saturated tenant runs exactly its
// limit, so each of its requests takes that share of its queued work out.
func (c *Controller) slotWaitLocked(cs *classState, now time.Time) time.Duration {
	slots := max(c.slots(cs), 1)
	// lowered: an override or Recovering's step holds the class below its
	// slots, and it starts nothing while as many of its requests run,
	// wherever they run (acquire): a stream of its on a borrowed slot holds
	// one of its lowered slots as one on its own does.
	lowered := slots < cs.cfg.Slots
	mean := cs.est.mean
	nowOff := float64(now.Sub(c.epoch))
	limit := cs.cfg.TenantRunning
	tenants := limit > 0 && cs.queue.n > 0
	var remaining, heldRemaining, heldQueued float64
	held, own, streams := 0, 0, 0
	for p := cs.runHead; p != nil; p = p.next {
		r := p.remaining(mean, nowOff, false) // a stream's is not used
		if p.owner == cs {
			own++
		}
		if p.stream {
			// A stream holds its slot for its lifetime, no work to spread
			// over the slots: one holding a slot of the class has the
			// requests played out (below). One on a borrowed slot holds
			// none of this class's, unless the class is lowered (then it
			// holds one of its lowered slots).
			if p.owner == cs || lowered {
				streams++
			}
			if tenants && p.tenant != "" {
				if tc, ok := cs.saturated(p.tenant); ok {
					heldQueued += float64(tc.work) / float64(tc.running)
				}
			}
			continue
		}
		if tenants && p.tenant != "" {
			if tc, ok := cs.saturated(p.tenant); ok {
				heldRemaining += r
				heldQueued += float64(tc.work) / float64(tc.running)
				held++
				continue
			}
		}
		remaining += r
	}
	if lent := cs.used - own; lent > 0 {
		// Borrowers hold some of this class's slots: none frees before
		// its borrower ends, which the borrower's class estimates.
		for _, b := range c.classes {
			if b == cs {
				continue
			}
			for p := b.runHead; p != nil && lent > 0; p = p.next {
				if p.owner == cs {
					if p.stream {
						streams++
					} else {
						remaining += p.remaining(b.est.mean, nowOff, false)
					}
					lent--
				}
			}
		}
	}
	queued := float64(cs.queuedWork)
	if streams > 0 || (lowered && cs.running > slots) {
		// A stream holds its slot until it ends, which may be soon (its
		// deadline ends its handler's context), and a lowered class that
		// runs more than its slots starts nothing until enough of them
		// end: spread over the slots, the work would say too late a
		// start. Slots free only as the requests on them end. A stream's
		// end is guessed only when streams hold every slot; otherwise a
		// stream without a deadline frees none — unless that leaves no
		// start at all (the slots not held by such streams serve
		// saturated tenants only), when nothing else could free one.
		guess := streams >= slots
		w := c.playOutLocked(cs, slots, lowered, nowOff, guess)
		if !guess && math.IsInf(w, 1) {
			w = c.playOutLocked(cs, slots, lowered, nowOff, true)
		}
		return waitOf(w)
	}
	slots -= streams
	if (held > 0 || heldQueued > 0) && held < slots && own == cs.running && own == cs.used {
		return time.Duration((queued - heldQueued + remaining) / float64(slots-held))
	}
	return time.Duration((queued + remaining + heldRemaining) / float64(slots))
}

// saturated returns tenant's counts in cs and whether the tenant is
// saturated: at its running limit with requests waiting, which can start
// only as its own running requests end.
func (cs *classState) saturated(tenant string) (tenantCount, bool) {
	tc := cs.tenants[tenant]
	return tc, tc.running >= cs.cfg.TenantRunning && tc.queued > 0
}

// playOutLocked is the wait, in nanoseconds, of a request of cs while
// streams hold some of its slots, or a lowered class runs more requests than
// its slots (slots of them, fewer than the requests running on them when an
// override or Recovering lowered them): the requests on its slots (lowered,
// its own on borrowed slots too) end one
// by one (Permit.remaining, which guesses a stream's end only with guess;
// +Inf when no request it could start after ever ends), each freeing a slot once no more run than
// slots; the queued requests, each the queue's mean work, start in turn on
// the first slot free; the request starts on the first free after them. A
// lowered class that borrows has two gates (playOutGates): its own
// requests' ends, and slots freed on its own or borrowed slots or lent idle.
// As in slotWaitLocked, a tenant at its running limit with requests
// waiting (saturated) keeps its slots and its waiters to itself, unless
// such tenants hold every slot. It allocates nothing for up to 16 running
// requests, and costs a pass over them and a search over the slots.
func (c *Controller) playOutLocked(cs *classState, slots int, lowered bool, nowOff float64, guess bool) float64 {
	limit := cs.cfg.TenantRunning
	var buf, heldBuf, runBuf, gateBuf [16]float64
	rem, held := buf[:0], heldBuf[:0]
	// run: lowered, the remainders of its own requests (not held), which
	// gate its starts by themselves; onBorrowed: how many of them run on
	// other classes' slots; borrowed: how many of those slots it may
	// borrow again when they end (their lender has no waiters, which the
	// slot would go to, and is within its slots, and no class before it
	// awaits a loan).
	run, onBorrowed, borrowed := runBuf[:0], 0, 0
	// A class before it in pump's order waiting for a loan takes the slot
	// a loan's end frees, and any idle one, first.
	loanTaken := false
	if lowered {
		for _, l := range c.classes {
			if l == cs {
				break
			}
			if l.queue.n > l.heldWaiters && c.awaitsLoan(l) {
				loanTaken = true
				break
			}
		}
	}
	var heldWork float64
	for _, b := range c.classes {
		for p := b.runHead; p != nil; p = p.next {
			if p.owner != cs && (!lowered || b != cs) {
				// The requests on its slots, whoever runs them; lowered,
				// also its own on borrowed slots, which gate its starts
				// as much.
				continue
			}
			r := p.remaining(b.est.mean, nowOff, guess)
			if limit > 0 && b == cs && p.tenant != "" {
				if tc, ok := cs.saturated(p.tenant); ok {
					held = append(held, r)
					heldWork += float64(tc.work) / float64(tc.running)
					continue
				}
			}
			if lowered && b == cs {
				run = append(run, r)
				if p.owner != cs {
					onBorrowed++
					if loanTaken || p.owner.queue.n > 0 || p.owner.used > c.slots(p.owner) {
						continue // its end frees no slot of cs's
					}
					borrowed++
				}
			}
			rem = append(rem, r)
		}
	}
	n, work := cs.queue.n, float64(cs.queuedWork)
	if len(held) > 0 && len(held) < slots {
		// The saturated tenants' slots serve only their own waiters.
		slots -= len(held)
		n, work = n-cs.heldWaiters, work-heldWork
	} else {
		rem = append(rem, held...)
		if lowered {
			run = append(run, held...)
		}
	}
	slices.Sort(rem)
	free := rem[max(len(rem)-slots, 0):] // a slot frees with the (len-slots+1)-th end
	freeNow := 0                         // slots free now besides free
	idle := 0
	if lowered && !loanTaken && !cs.frozen && !c.shedding(cs) {
		// Idle slots lent now (acquire) take its next start as soon as
		// fewer of its own requests run than its slots.
		for _, l := range c.classes {
			if l != cs && l.cfg.LendIdle && l.queue.n == 0 {
				idle += max(c.slots(l)-l.used, 0)
			}
		}
	}
	if idle > 0 || (onBorrowed > 0 && (len(run) < len(rem) || borrowed < onBorrowed)) {
		// Lowered, it borrows and lends at once: its k-th start needs
		// both k of its own requests ended (fewer run than its slots) and
		// k slots free — its own, whoever holds them, or one it borrowed,
		// which its request's end gives back to be borrowed again unless
		// the lender has waiters of its own. One play-out of both would
		// wait for the end of the lender's borrower too. Each start is the
		// later of the two gates.
		slices.Sort(run)
		free = playOutGates(run, rem, slots, borrowed+idle, gateBuf[:0])
	} else {
		// Slots no request holds are free now (Stats and retry-afters
		// ask with a slot free when the class is lowered, which
		// predictedWaitLocked leaves to slotWaitLocked's play-out; a
		// decision asks only with none).
		freeNow = max(slots-len(free), 0)
	}
	if len(free) == 0 {
		return 0
	}
	return nextStart(free, freeNow, n, work/float64(max(n, 1)))
}

// awaitsLoan reports whether the waiters of l (not held by their tenants)
// wait for a slot to borrow: l's own slots in force are all used, and
// nothing else keeps them from borrowing (acquire).
func (c *Controller) awaitsLoan(l *classState) bool {
	n := c.slots(l)
	return !l.frozen && !c.shedding(l) && l.used >= n && !(n < l.cfg.Slots && l.running >= n)
}

// playOutGates returns, for a lowered class that borrows (borrowed: its
// requests on other classes' slots whose lenders will lend them again, and
// the idle slots lent now), when each of its slots' worth of starts can
// happen, earliest first: the k-th when the k-th of its own requests (run,
// sorted; slots of them may run) has ended and the k-th slot (rem, sorted:
// everything on its slots and on those it borrowed and may borrow again;
// slots+borrowed of them) has freed, a slot counted free now while fewer
// than its number are held. It reuses dst's storage, which must not share
// run's.
func playOutGates(run, rem []float64, slots, borrowed int, dst []float64) []float64 {
	at := func(list []float64, n, k int) float64 {
		// The k-th (0-based) of n slot ends, the first n-len(list) now.
		if i := k - (n - len(list)); i >= 0 {
			return list[i]
		}
		return 0
	}
	run = run[max(len(run)-slots, 0):]
	all := rem[max(len(rem)-(slots+borrowed), 0):]
	for k := range slots {
		dst = append(dst, max(at(run, slots, k), at(all, slots+borrowed, k)))
	}
	return dst
}

// tenantNextLocked is how long until a tenant over its limits in cs is
// likely to have room again: until the first of its running requests ends
// (its remainder clamped as in slotWaitLocked; a stream's end guessed
// only when streams are all it runs: Permit.remaining), which lets its next
// request run or its first waiter start; 0 when none of its requests runs
// (the class's predicted wait covers it). While nothing is known of the
// class's service time, a unary request is expected to run as long again
// as it has run, but not past its deadline, as unknownWaitLocked expects
// (the mean, 0, would say it ends now). Only retry-afters use it.
func (c *Controller) tenantNextLocked(cs *classState, tenant string, now time.Time) time.Duration {
	mean := cs.est.mean
	unknown := cs.est.unknown()
	nowOff := float64(now.Sub(c.epoch))
	guess := c.onlyStreamsLocked(cs, tenant)
	next := -1.0
	for p := cs.runHead; p != nil; p = p.next {
		if p.tenant == tenant {
			r := p.remaining(mean, nowOff, guess)
			if unknown && !p.stream {
				r = max(r, p.guessLeft(nowOff))
			}
			if next < 0 || r < next {
				next = r
			}
		}
	}
	return waitOf(max(next, 0))
}

// maxWait bounds the waits predicted in float nanoseconds: half of
// time.Duration's range, so that neither the conversion nor a wait plus a
// service time and a margin overflows. A stream's deadline centuries away
// is ≈2^63 ns from the epoch (time.Time.Sub saturates), and the play-out
// frees its slot there.
const maxWait = time.Duration(math.MaxInt64 / 2)

// waitOf converts a predicted wait in nanoseconds to a time.Duration, at
// most maxWait.
func waitOf(ns float64) time.Duration {
	if ns >= float64(maxWait) {
		return maxWait
	}
	return time.Duration(ns)
}

// minRetryAfter is the floor of suggested delays when nothing is known.
const minRetryAfter = 10 * time.Millisecond

// RetryAfter suggests a delay before a repeat of a request of the named
// class, as the class's QUEUE_FULL refusal would now: its predicted wait
// (its learned service time when a request would start at once), jittered
// in [½, 1½) of itself and below the bound of [WithMaxRetryAfter]; for a name that is no
// class, the floor of suggestions (10 ms), jittered. It is for refusals made
// on the class's behalf outside the controller (tollgate's interceptor
// gives one to a try that admission dropped for the try's own deadline). It
// only observes: it takes the lock once and changes nothing.
func (c *Controller) RetryAfter(class string) time.Duration {
	cs, ok := c.byName[class]
	if !ok {
		return c.jitter(0)
	}
	c.mu.Lock()
	now := c.nowLocked()
	base := c.retryBaseLocked(cs, status.ReasonQueueFull, now)
	c.mu.Unlock()
	return c.jitter(base)
}

// nowLocked is the time of a call that has no …At form, or that is the
// plain form of one (Stats, Mode, Overrides, SetOverride, ClearOverride,
// RetryAfter, Release, ReleaseMissCounted, Abandon, the tap (tapNow), and a
// waiter's cancellation: ctxEnded):
// the controller's clock (the real one, or WithClock's), never before the
// latest time it saw; but while the controller is driven on a virtual
// clock (its last admission an AdmitAt), the latest time the caller gave,
// since the wall clock says nothing of the caller's time.
func (c *Controller) nowLocked() time.Time {
	if c.virtual {
		return c.last
	}
	return maxTime(c.cfg.now(), c.last)
}

// retryAfterLocked suggests a delay that reflects the class's queue: the
// predicted wait (or the learned service time when a request would start
// at once), jittered (see jitter); for SHED, the time until the class can
// be admitted again (readmitAtLocked), jittered above it (see jitterAfter).
func (c *Controller) retryAfterLocked(cs *classState, reason status.Reason, now time.Time) time.Duration {
	if reason == status.ReasonShed {
		return c.jitterAfter(max(c.readmitAtLocked(cs, now).Sub(now), 0))
	}
	return c.jitter(c.retryBaseLocked(cs, reason, now))
}

func (c *Controller) retryBaseLocked(cs *classState, reason status.Reason, now time.Time) time.Duration {
	base := c.predictedWaitLocked(cs, now)
	if base <= 0 {
		base = cs.est.meanD()
	}
	return base
}

// readmitAtLocked is the earliest time at which cs, frozen or shed at now,
// can be admitted again as far as the controller can tell at now (an
// operator may clear an override sooner): the end of the last override
// that freezes it; and, while it is an optional class shed because the
// mode is Degraded, the time the mode can first leave Degraded — the end
// of the overrides forcing Degraded (the latest set wins, so an override
// forcing another mode, set later, ends Degraded sooner), and under the
// state machine's own Degraded the end of the current window (one healthy
// window moves Degraded to Recovering, whose first step re-admits the
// class), or, while Degraded is held after a fall back from Recovering,
// of the window that completes ExitAfter healthy ones. now for a class
// that is neither frozen nor shed.
func (c *Controller) readmitAtLocked(cs *classState, now time.Time) time.Time {
	at := now
	if cs.frozen {
		for _, a := range c.ovr.list {
			if a.Class == cs.cfg.Name && a.Freeze && a.Expires.After(at) {
				at = a.Expires
			}
		}
	}
	if !c.shedding(cs) {
		return at
	}
	// The forced mode at t is that of the override with a mode, in force
	// at t, set last (the highest ID). Walk the ends of the overrides
	// forcing a mode, in time order, until the forced mode is not
	// Degraded.
	t := now
	for c.forcedAt(t) == ModeDegraded {
		next := time.Time{}
		for _, a := range c.ovr.list {
			if a.Mode != 0 && a.Expires.After(t) && (next.IsZero() || a.Expires.Before(next)) {
				next = a.Expires
			}
		}
		t = next
	}
	if c.forcedAt(t) == 0 && c.cfg.stages&StageDegradation != 0 && c.deg.mode == ModeDegraded {
		// The state machine's Degraded, which it leaves at the end of a
		// healthy window at the earliest: its windows go on closing
		// underneath a forced mode, so this is a lower bound.
		d := &c.deg
		end := d.winEnd
		if d.hold {
			end = end.Add(time.Duration(max(d.cfg.ExitAfter-d.healthy-1, 0)) * d.cfg.Window)
		}
		t = maxTime(t, end)
	}
	return maxTime(at, t)
}

// forcedAt is the mode the overrides in force at t force (0 for none).
func (c *Controller) forcedAt(t time.Time) Mode {
	var m Mode
	var id uint64
	for _, a := range c.ovr.list {
		if a.Mode != 0 && a.Expires.After(t) && a.ID > id {
			m, id = a.Mode, a.ID
		}
	}
	return m
}

// jitter spreads a suggested delay d uniformly over [½, 1½) of itself, so
// that refused clients do not come back together: d at least
// minRetryAfter, and at most ⅔ of the bound (WithMaxRetryAfter), so that
// every suggestion is below the bound however long the predicted wait
// (a bound below 15 ms wins over the floor).
func (c *Controller) jitter(d time.Duration) time.Duration {
	d = min(max(d, minRetryAfter), twoThirds(c.cfg.maxRA))
	return d/2 + rand.N(d)
}

// jitterAfter spreads a suggested delay d uniformly over [d, d + s), s
// half of the larger of d and the degradation window: for a refusal that
// no repeat before d can escape (SHED until an override ends or the mode
// can change), so that refused clients come back neither before it nor
// together. Every client refused before the same instant is told that
// instant: spread over only half of each one's time left, those refused
// just before it would all come back at it (a sixth of a window's shed
// clients within its first 50th), so each spreads over half a window at
// least. d is at least minRetryAfter and at most ⅔ of the bound
// (WithMaxRetryAfter), as in jitter, and so is the window in s, so that
// every suggestion is below the bound.
func (c *Controller) jitterAfter(d time.Duration) time.Duration {
	b := twoThirds(c.cfg.maxRA)
	d = min(max(d, minRetryAfter), b)
	s := max(d, min(c.cfg.degradation.Window, b)) / 2
	return d + rand.N(max(s, 1))
}

// twoThirds is ⌊2b/3⌋ for a positive b, without overflowing for a b above
// half of time.Duration's range (WithMaxRetryAfter(math.MaxInt64) asks for
// no practical bound).
func twoThirds(b time.Duration) time.Duration {
	return b/3*2 + b%3*2/3
}

// refusal builds the NOT_ADMITTED error of a refusal.
func refusal(cs *classState, reason status.Reason, ra time.Duration, final bool) error {
	f := status.Fields{RetryAfter: ra, Final: final}
	if cs != nil {
		f.Class = cs.cfg.Name
	}
	return status.NotAdmitted(reason, f)
}

// waitEndedError is a NOT_ADMITTED refusal caused by the caller's context
// ending: it unwraps to both the refusal and the context's error.
type waitEndedError struct {
	refusal error
	cause   error
}

func waitEnded(reason status.Reason, cs *classState, cause error, ra time.Duration, final bool) error {
	return &waitEndedError{refusal: refusal(cs, reason, ra, final), cause: cause}
}

func (e *waitEndedError) Error() string   { return e.refusal.Error() + ": " + e.cause.Error() }
func (e *waitEndedError) Unwrap() []error { return []error{e.refusal, e.cause} }

// GRPCStatus lets the error cross gRPC as its refusal.
func (e *waitEndedError) GRPCStatus() *grpcstatus.Status {
	st, _ := grpcstatus.FromError(e.refusal)
	return st
}

// emitLocked queues an observer event (only when there is an observer).
func (c *Controller) emitLocked(e Event) {
	if c.cfg.observer != nil {
		c.pending = append(c.pending, e)
	}
}

// unlock refreshes the tap flags, checks invariants (tests), releases the
// lock and then emits the events the locked section produced.
func (c *Controller) unlock() {
	flagged := false
	for _, cs := range c.classes {
		c.refreshFlag(cs)
		flagged = flagged || cs.full.Load() != 0
	}
	var due int64
	if len(c.ovr.list) > 0 {
		due = c.ovr.nextExpiry.UnixNano()
	}
	// The mode moves at a window's end; and while the tap refuses, the
	// first request after the end must reach Admit to close the window, or
	// the tap's refusals of later windows would all be counted in it.
	if c.cfg.stages&StageDegradation != 0 && (c.deg.mode != ModeNormal || flagged) {
		if w := c.deg.winEnd.UnixNano(); due == 0 || w < due {
			due = w
		}
	}
	if due != c.due.Load() {
		c.due.Store(due)
	}
	if c.virtual {
		if l := c.last.UnixNano(); l != c.tapLast.Load() {
			c.tapLast.Store(l)
		}
	}
	if c.virtual != c.tapVirtual.Load() {
		c.tapVirtual.Store(c.virtual)
	}
	if c.cfg.realClock && !c.virtual && !c.closed && due != 0 && (c.wakeAt == 0 || due < c.wakeAt) && c.waiting() {
		c.wakeAt = due
		if c.wake == nil {
			c.wake = time.AfterFunc(time.Until(time.Unix(0, due)), c.awake)
		} else {
			c.wake.Reset(time.Until(time.Unix(0, due)))
		}
	}
	if c.cfg.check != nil {
		c.cfg.check(c.checkInvariants())
	}
	evs := c.pending
	c.pending = nil
	trs := c.traces
	c.traces = nil
	c.mu.Unlock()
	for _, e := range evs {
		c.observe(e)
	}
	for _, t := range trs {
		c.m.trace(t)
	}
}

// observe gives e to the observer, recovering and counting a panic of its:
// the observer runs after the lock is released, on the path that returns a
// permit (Admit) or on the controller's own timer (awake), where a panic
// would lose a permit's slot for good or end the process. The event is
// lost; the controller stays sound.
func (c *Controller) observe(e Event) {
	defer func() {
		if recover() != nil {
			c.observerPanics.Add(1)
		}
	}()
	c.cfg.observer(e)
}

// refreshFlag sets the class's atomic tap flag: SHED while frozen or shed,
// QUEUE_FULL (CONCURRENCY_FULL without a queue) while no slot is free and the
// queue is at its bound, open otherwise.
func (c *Controller) refreshFlag(cs *classState) {
	var reason status.Reason
	switch {
	case c.closed && cs != c.control:
		reason = status.ReasonDraining
	case cs.frozen || c.shedding(cs):
		reason = status.ReasonShed
	case cs.queue.n >= cs.queueCap && c.acquire(cs, c.slots(cs)) == nil:
		reason = status.ReasonQueueFull
		if cs.queueCap == 0 {
			reason = status.ReasonConcurrencyFull
		}
	}
	// The hint first, then the flag: a tap call that reads the flag reads
	// a hint set for it (or for a later one).
	switch reason {
	case 0, status.ReasonDraining:
	case status.ReasonShed:
		cs.readmit.Store(c.readmitAtLocked(cs, c.last).UnixNano())
	default:
		cs.hint.Store(int64(c.retryBaseLocked(cs, reason, c.last)))
	}
	if int32(reason) != cs.full.Load() {
		cs.full.Store(int32(reason))
	}
	if st := c.stepped(cs); st != cs.steppedNow.Load() {
		cs.steppedNow.Store(st)
	}
	var hopeless int64
	if reason == status.ReasonQueueFull && c.cfg.stages&StageDequeue != 0 && !cs.queue.soonest.IsZero() {
		hopeless = cs.queue.soonest.Add(-cs.est.service()).UnixNano()
	}
	if hopeless != cs.hopeless.Load() {
		cs.hopeless.Store(hopeless)
	}
}

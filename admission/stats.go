package admission

import (
	"fmt"
	"time"

	"github.com/tollgate-go/tollgate/status"
)

// EventKind says what an [Event] reports.
type EventKind uint8

const (
	// EventAdmitted: a request got a slot on arrival.
	EventAdmitted EventKind = iota + 1
	// EventQueued: a request entered its class's queue.
	EventQueued
	// EventStarted: a waiting request got a slot.
	EventStarted
	// EventRefused: a request was refused on arrival (or its context had
	// ended before Admit looked at it).
	EventRefused
	// EventDropped: a waiting request left the queue without running: its
	// deadline could no longer be met, its class was shed or frozen, the
	// controller closed, or its context ended.
	EventDropped
	// EventReleased: a running request released its permit.
	EventReleased
	// EventMode: the state machine's mode changed (Mode is the new one).
	EventMode
)

var eventNames = [...]string{"", "ADMITTED", "QUEUED", "STARTED", "REFUSED", "DROPPED", "RELEASED", "MODE"}

// String returns the kind's name, for example "QUEUED".
func (k EventKind) String() string {
	if int(k) < len(eventNames) && k > 0 {
		return eventNames[k]
	}
	return "INVALID"
}

// Event is one admission event, given to the observer of [WithObserver].
type Event struct {
	// Kind says what happened.
	Kind EventKind
	// Class is the request's class ("" for EventMode).
	Class string
	// Tenant is the request's tenant, as given to Admit. Events are for
	// logs and tests; metrics never carry tenants.
	Tenant string
	// Reason is the refusal's reason (EventRefused, EventDropped);
	// UNSPECIFIED for a request counted as cancelled: a waiter that left
	// because its context was canceled (EventDropped), or a request whose
	// context was canceled before Admit looked at it (EventRefused).
	Reason status.Reason
	// Mode is the new mode (EventMode).
	Mode Mode
	// At is when it happened (for EventDropped after the context ended:
	// when the request arrived).
	At time.Time
	// Deadline is the request's deadline (EventAdmitted, EventStarted).
	Deadline time.Time
	// QueuedAhead is the number of requests of the class waiting ahead
	// (EventQueued, EventRefused on arrival).
	QueuedAhead int
	// Waited is how long the request waited (EventStarted).
	Waited time.Duration
}

// Stats is a snapshot of a controller.
type Stats struct {
	// Mode is the effective mode.
	Mode Mode
	// Transitions counts the state machine's mode changes so far.
	Transitions int
	// ObserverPanics counts the panics of the observer (WithObserver)
	// that the controller recovered; each lost the event it was given.
	ObserverPanics uint64
	// Classes holds one entry per class, the control class first.
	Classes []ClassStats
}

// Class returns the stats of the named class, and false if there is none.
func (s Stats) Class(name string) (ClassStats, bool) {
	for _, c := range s.Classes {
		if c.Name == name {
			return c, true
		}
	}
	return ClassStats{}, false
}

// ClassStats is a snapshot of one class.
type ClassStats struct {
	// Name is the class's name.
	Name string
	// Slots is the number of slots the class may use now (after overrides
	// and degradation); ConfiguredSlots what its configuration reserves.
	Slots, ConfiguredSlots int
	// UsedSlots is the class's slots in use (by its requests or borrowers);
	// Running the class's requests running (on its slots or borrowed ones).
	UsedSlots, Running int
	// Queued, QueuedBytes and QueuedWork describe the waiting requests;
	// QueueLimit is the bound in force.
	Queued, QueueLimit int
	QueuedBytes        int64
	QueuedWork         time.Duration
	// OldestWait is how long the oldest waiting request has waited.
	OldestWait time.Duration
	// ServiceMean and ServiceP95 are the learned service times (both
	// ExpectedServiceTime before any is learned). ServiceP95 is a
	// streaming estimate that climbs a step per slower sample and, when it
	// stands at least twice above what completed work bears out, drops
	// to that after 30 completed samples in a row below it: until the
	// class has learned 20 samples it reads at least ServiceMean, which its
	// first steps would otherwise leave it under. Work that ended after its
	// deadline teaches its time as a lower bound: it may raise ServiceP95,
	// never lower it. The deadline stage plans with the larger of the two.
	ServiceMean, ServiceP95 time.Duration
	// PredictedWait is the wait of a request arriving now (one its
	// tenant's limits do not hold back), as admission's deadline stage
	// predicts it: 0 when a slot it may take is free (its class's, or one
	// lent to it) and no waiter of the class can take it first, since it
	// would start at once; else the wait it would be told of, at most half
	// of time.Duration's range (about 146 years: a stream whose deadline is
	// farther away frees its slot no sooner). While the class knows nothing
	// of its service time (no ExpectedServiceTime, nothing learned), it
	// expects each running request to run as long again as it has run (not
	// past its deadline), and each waiter to take their average run so
	// far, over the slots its streams do not hold (see the package
	// documentation, "Learning and prediction"); the deadline stage does
	// not plan with that guess.
	PredictedWait time.Duration
	// Admitted counts requests that got a slot; Refused counts refusals by
	// reason name ("QUEUE_FULL", ...), the tap's included.
	Admitted uint64
	Refused  map[string]uint64
	// Cancelled counts requests whose context was canceled (their caller
	// went away) before they started, while they waited or before Admit
	// looked at them: no refusal, and in no degradation window — also when
	// another call (a release, an arrival, Stats, a shed, an override's
	// trim, Close) finds such a waiter, to start it, drop it as unable to
	// finish or refuse it, or takes it out wherever it stands (its
	// context's ending noted, or on a virtual clock), before its own
	// goroutine has seen its context end.
	// One whose context's deadline, or the request's, had passed is
	// refused DEADLINE_EXPIRED instead.
	Cancelled uint64
	// FalseAccepts counts admitted requests that finished after their
	// deadline; FalseRejects DEADLINE_UNREACHABLE refusals judged, from the
	// requests that started after them, to have been avoidable.
	FalseAccepts, FalseRejects uint64
	// Tenants holds the tenants with running or waiting requests (only for
	// classes with tenant limits).
	Tenants map[string]TenantStats
}

// TenantStats is one tenant's share of a class.
type TenantStats struct {
	// Running and Queued count the tenant's requests; QueuedWork is their
	// estimated work.
	Running, Queued int
	QueuedWork      time.Duration
}

// Stats returns a snapshot of the controller now. Now is the controller's
// clock, or, while the controller is driven on a virtual clock (its last
// admission an AdmitAt), the latest time the caller gave. Like a request
// arriving, it brings the controller up to date first: overrides that ran
// out expire, degradation windows that ended close, the waiters that can
// no longer finish by their deadlines are dropped (DEADLINE_EXPIRED, as the
// dequeue stage drops them) and the waiters that can start start; so the
// snapshot, and each class's PredictedWait, is what admission would see.
// It takes the lock once and allocates; it is meant for operators and
// tests, not for every request.
func (c *Controller) Stats() Stats {
	c.mu.Lock()
	return c.statsLocked(c.nowLocked())
}

// StatsAt is [Controller.Stats] at time now (virtual clocks).
func (c *Controller) StatsAt(now time.Time) Stats {
	c.mu.Lock()
	return c.statsLocked(now)
}

// statsLocked is StatsAt with the lock held; it unlocks.
func (c *Controller) statsLocked(now time.Time) Stats {
	c.advance(now)
	// As decideLocked does before it predicts a wait: a waiter that can no
	// longer finish holds no place a request arriving now could take, and
	// what can start (a lending class's queue may have emptied since the
	// last pump: a waiter that left on a virtual clock pumps nothing)
	// starts before it. Every class's, since each class's PredictedWait is
	// an arrival's there. Only what an arrival would do at now, which a
	// give-up timer, a release or the next arrival would do anyway: the
	// snapshot says how things are, not how they were at the last pump.
	for _, cs := range c.classes {
		c.dropExpiredLocked(cs, now)
	}
	c.pump(now)
	s := Stats{Mode: c.mode(), Transitions: c.deg.transitions, ObserverPanics: c.observerPanics.Load()}
	for _, cs := range c.classes {
		st := ClassStats{
			Name:            cs.cfg.Name,
			Slots:           c.slots(cs),
			ConfiguredSlots: cs.cfg.Slots,
			UsedSlots:       cs.used,
			Running:         cs.running,
			Queued:          cs.queue.n,
			QueueLimit:      cs.queueCap,
			QueuedBytes:     cs.queuedBytes,
			QueuedWork:      time.Duration(cs.queuedWork),
			ServiceMean:     cs.est.meanD(),
			ServiceP95:      cs.est.p95D(),
			PredictedWait:   c.predictedWaitLocked(cs, now),
			Admitted:        cs.admitted,
			Refused:         map[string]uint64{},
			Cancelled:       cs.cancelled,
			FalseAccepts:    cs.falseAccepts,
			FalseRejects:    cs.falseRejects,
		}
		if cs.queue.head != nil {
			st.OldestWait = max(now.Sub(cs.queue.head.enq), 0)
		}
		for r, n := range cs.refused {
			st.Refused[status.ReasonName(r)] = n
		}
		for i, r := range tapReasons {
			if n := cs.tapRefused[i].Load(); n > 0 {
				st.Refused[status.ReasonName(r)] += n
			}
		}
		if len(cs.tenants) > 0 {
			st.Tenants = map[string]TenantStats{}
			for t, tc := range cs.tenants {
				st.Tenants[t] = TenantStats{Running: tc.running, Queued: tc.queued, QueuedWork: time.Duration(tc.work)}
			}
		}
		s.Classes = append(s.Classes, st)
	}
	c.unlock()
	return s
}

// checkStart verifies, for tests, that a request of cs that just started
// on owner's slot respects the limits in force (a lowered limit leaves the
// requests already running alone, so only starts are judged by it): the
// owner's slots in use are within its effective slots, and a class whose
// slots are lowered runs no more than them, borrowed slots included.
func (c *Controller) checkStart(cs, owner *classState) {
	if c.viol != nil {
		return
	}
	if n := c.slots(owner); owner.used > n {
		c.viol = fmt.Errorf("class %s: start uses %d of %s's slots over the %d in force", cs.cfg.Name, owner.used, owner.cfg.Name, n)
	}
	if n := c.slots(cs); n < cs.cfg.Slots && cs.running > n {
		c.viol = fmt.Errorf("class %s: start runs %d over the %d slots in force", cs.cfg.Name, cs.running, n)
	}
}

// checkInvariants verifies invariant 9's bounds on the locked state, the
// configured ones at every instant and the ones in force at every start.
func (c *Controller) checkInvariants() error {
	if err := c.viol; err != nil {
		c.viol = nil
		return err
	}
	used, running, queued, mortal := 0, 0, 0, 0
	for _, cs := range c.classes {
		cfg := cs.cfg
		if cs.used < 0 || cs.used > cfg.Slots {
			return fmt.Errorf("class %s: %d slots used of %d", cfg.Name, cs.used, cfg.Slots)
		}
		if cs.queue.n > cs.queueCap || cs.queueCap > cfg.QueueItems {
			return fmt.Errorf("class %s: %d queued over %d in force (%d configured)", cfg.Name, cs.queue.n, cs.queueCap, cfg.QueueItems)
		}
		if cfg.QueueBytes > 0 && cs.queuedBytes > cfg.QueueBytes {
			return fmt.Errorf("class %s: %d bytes queued over %d", cfg.Name, cs.queuedBytes, cfg.QueueBytes)
		}
		var n, qMortal int
		var bytes, work int64
		tq := map[string]int{}
		for w := cs.queue.head; w != nil; w = w.next {
			n++
			if w.mortal {
				qMortal++
			}
			bytes += w.size
			work += w.work
			if w.tenantOn {
				tq[w.tenant]++
			}
			if sooner(cs.queue.soonest, w.deadline) != cs.queue.soonest {
				return fmt.Errorf("class %s: a waiter's deadline %v precedes the queue's bound %v", cfg.Name, w.deadline, cs.queue.soonest)
			}
		}
		if n != cs.queue.n || bytes != cs.queuedBytes || work != cs.queuedWork || qMortal != cs.mortal {
			return fmt.Errorf("class %s: queue accounts drifted", cfg.Name)
		}
		held := 0
		for w := cs.queue.head; w != nil; w = w.next {
			if c.tenantHeld(cs, w) {
				held++
			}
		}
		if held != cs.heldWaiters {
			return fmt.Errorf("class %s: %d waiters held by their tenant, %d counted", cfg.Name, held, cs.heldWaiters)
		}
		for t, tc := range cs.tenants {
			if cfg.TenantRunning > 0 && tc.running > cfg.TenantRunning {
				return fmt.Errorf("class %s: tenant %s runs %d over %d", cfg.Name, t, tc.running, cfg.TenantRunning)
			}
			if cfg.TenantQueued > 0 && tc.queued > cfg.TenantQueued {
				return fmt.Errorf("class %s: tenant %s queues %d over %d", cfg.Name, t, tc.queued, cfg.TenantQueued)
			}
			if cfg.TenantQueueWork > 0 && tc.work > int64(cfg.TenantQueueWork) {
				return fmt.Errorf("class %s: tenant %s queues work %v over %v", cfg.Name, t, time.Duration(tc.work), cfg.TenantQueueWork)
			}
			if tc.queued != tq[t] || tc.running < 0 {
				return fmt.Errorf("class %s: tenant %s accounts drifted", cfg.Name, t)
			}
		}
		if !cfg.LendIdle && cs.used > cs.running {
			return fmt.Errorf("class %s: slots used by others without lending", cfg.Name)
		}
		used += cs.used
		running += cs.running
		queued += cs.queue.n
		mortal += cs.mortal
	}
	if used != running || queued != c.queued || mortal != c.mortal {
		return fmt.Errorf("permits drifted: %d slots used, %d running, %d/%d queued", used, running, queued, c.queued)
	}
	return nil
}

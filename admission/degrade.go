package admission

import (
	"math"
	"time"

	"github.com/tollgate-go/tollgate/status"
)

// Mode is the controller's degradation mode (DESIGN.md §3.10). The zero
// value means "not set" (an [Override] that forces no mode).
type Mode uint8

const (
	// ModeNormal admits every class to its configured limits.
	ModeNormal Mode = iota + 1
	// ModeDegraded sheds optional classes (SHED).
	ModeDegraded
	// ModeRecovering re-admits optional classes in steps: after h of the
	// ExitAfter healthy windows it needs, an optional class may use
	// ⌈Slots·h/ExitAfter⌉ slots. An overloaded window while Recovering
	// returns to Degraded, which then holds for ExitAfter consecutive
	// healthy windows before Recovering starts again, so an oscillating load
	// changes the optional classes' capacity at most once per exit period.
	ModeRecovering
)

// String returns the mode's name: "NORMAL", "DEGRADED", "RECOVERING",
// "UNSET" for the zero value, or "INVALID".
func (m Mode) String() string {
	switch m {
	case 0:
		return "UNSET"
	case ModeNormal:
		return "NORMAL"
	case ModeDegraded:
		return "DEGRADED"
	case ModeRecovering:
		return "RECOVERING"
	}
	return "INVALID"
}

// degradeState is the mode state machine and the current window's counts.
// The controller's lock guards it.
type degradeState struct {
	cfg         Degradation
	mode        Mode
	winEnd      time.Time
	over        int  // consecutive overloaded windows (Normal)
	healthy     int  // consecutive healthy windows (Degraded, Recovering)
	hold        bool // re-entered Degraded from Recovering: stay for the exit period
	decisions   int
	refusals    int
	maxWait     time.Duration
	transitions int
}

func (d *degradeState) init(cfg Degradation, epoch time.Time) {
	d.cfg = cfg
	d.mode = ModeNormal
	d.winEnd = epoch.Add(cfg.Window)
}

// started counts a request of cs that started after waiting waited.
func (d *degradeState) started(cs *classState, waited time.Duration) {
	if cs.cfg.Name == ControlClass {
		return
	}
	d.decisions++
	d.maxWait = max(d.maxWait, waited)
}

// waited counts, against MaxQueueAge, the wait of a request of cs that left
// its queue unrun: a wait, but no decision (see noteLeftWaitLocked).
func (d *degradeState) waited(cs *classState, waited time.Duration) {
	if cs.cfg.Name == ControlClass {
		return
	}
	d.maxWait = max(d.maxWait, waited)
}

// refused counts a refusal of a request of cs.
func (d *degradeState) refused(cs *classState, reason status.Reason) { d.refusedN(cs, reason, 1) }

// refusedN counts n refusals of requests of cs with the same reason.
func (d *degradeState) refusedN(cs *classState, reason status.Reason, n int) {
	if cs.cfg.Name == ControlClass {
		return
	}
	switch reason {
	case status.ReasonTenantLimit, status.ReasonRequestTooLarge:
		// The caller's doing: neither load nor a sign of health, so that
		// a tenant flooding past its own limits cannot hide overload.
		return
	case status.ReasonShed, status.ReasonDraining:
		// The server's own choice (degraded, or shutting down): counted as
		// healthy decisions, shed optional traffic would dilute the
		// refusals of the classes still served and end Degraded while they
		// are as overloaded as before.
		return
	}
	d.decisions += n
	switch reason {
	case status.ReasonQueueFull, status.ReasonConcurrencyFull,
		status.ReasonDeadlineUnreachable, status.ReasonDeadlineExpired:
		d.refusals += n
	}
}

// mode is the effective mode: an operator's forced mode, else the state
// machine's (Normal when the degradation stage is off).
func (c *Controller) mode() Mode {
	if c.ovr.forced != 0 {
		return c.ovr.forced
	}
	if c.cfg.stages&StageDegradation == 0 {
		return ModeNormal
	}
	return c.deg.mode
}

// shedding reports whether requests of cs are refused with SHED by mode.
func (c *Controller) shedding(cs *classState) bool {
	return cs.cfg.Optional && c.mode() == ModeDegraded
}

// Mode returns the controller's effective mode now, closing elapsed windows
// first. Now is the controller's clock, or, while the controller is driven
// on a virtual clock (its last admission an AdmitAt), the latest time the
// caller gave. It is safe for concurrent use.
func (c *Controller) Mode() Mode {
	c.mu.Lock()
	return c.modeLocked(c.nowLocked())
}

// ModeAt is [Controller.Mode] at time now (virtual clocks).
func (c *Controller) ModeAt(now time.Time) Mode {
	c.mu.Lock()
	return c.modeLocked(now)
}

// modeLocked is ModeAt with the lock held; it unlocks.
func (c *Controller) modeLocked(now time.Time) Mode {
	c.advance(now)
	m := c.mode()
	c.unlock()
	return m
}

// advance brings time-driven state up to now: overrides expire, windows close.
// The windows that ended before an override's expiry are closed first,
// with it in force (a forced mode, a lowered class): over a long gap (a
// virtual clock; a timer that ran late) they are judged as they would have
// been had the controller looked in time. What the expiry lets happen (a
// waiter starts, a shed one is dropped) happens at now, after the windows
// that end by now are closed, as rollWindows does for Recovering's steps:
// nobody started the waiter before, so those windows see it waiting, and
// its wait counts in the window it starts in.
//
// It also takes out the waiters whose callers have gone
// (sweepGoneLocked), so that every call that judges the queues — an
// arrival, a release's pump, Stats — finds none holding a place: on a
// virtual clock first, at the latest time the controller had been given
// (each waiter whose context can end is looked at: a cost of the virtual
// clock only); on its own clock last, at now, where one whose ending has
// been noted (noteGone) stands.
func (c *Controller) advance(now time.Time) {
	if c.virtual && c.mortal > 0 {
		// On a virtual clock a waiter whose caller has gone is judged at
		// the time its context ended — the latest time the controller had
		// been given — before this call moves the time on: no window that
		// closes now sees it wait, nor a deadline that passes in the gap
		// makes it expire, whether or not its goroutine ran first.
		c.sweepGoneLocked(c.last, true)
	}
	if now.After(c.last) {
		c.last = now
	}
	c.advanceTime(now)
	if !c.virtual && c.sweepGoneLocked(now, false) {
		// On the controller's own clock, as ctxEnded would at now: the
		// windows that ended while they waited saw them wait, and what
		// their leaving lets start starts.
		c.pump(now)
	}
}

// advanceTime is advance's time-driven part: overrides expire, windows
// close.
func (c *Controller) advanceTime(now time.Time) {
	if len(c.ovr.list) > 0 && !now.Before(c.ovr.nextExpiry) {
		c.expireOverridesBy(now, c.ovr.list, true, func(e time.Time) {
			if c.cfg.stages&StageDegradation != 0 && c.deg.winEnd.Before(e) {
				c.closeWindows(e.Add(-1))
			}
		})
		if c.cfg.stages&StageDegradation != 0 && !now.Before(c.deg.winEnd) {
			c.closeWindows(now)
		}
		c.actOnLimits(now) // sheds what a Degraded mode sheds, too
		return
	}
	if c.cfg.stages&StageDegradation != 0 && !now.Before(c.deg.winEnd) {
		c.rollWindows(now)
	}
}

// rollWindows closes every window that ended by now, in order, and moves
// the state machine. The tap's refusals since the last roll count in the
// first window it closes. Windows without traffic are healthy unless a request
// has been waiting MaxQueueAge by their end. Once enough empty windows closed
// to saturate the state machine, the rest that would end alike are skipped
// at once (see skipWindows).
func (c *Controller) rollWindows(now time.Time) {
	before := c.mode()
	c.closeWindows(now)
	if after := c.mode(); after != before && after == ModeDegraded {
		c.shedQueued(now)
	}
	c.pump(now)
}

// closeWindows is rollWindows without its consequences for the queues: it
// closes the windows and moves the state machine only.
func (c *Controller) closeWindows(now time.Time) {
	d := &c.deg
	w := d.cfg.Window
	c.foldTapRefusals()
	saturate := d.cfg.EnterAfter + 2*d.cfg.ExitAfter + 2
	for i := 0; !now.Before(d.winEnd); i++ {
		overloaded := false
		if d.cfg.MaxRefusalRatio >= 0 && d.decisions > 0 && d.decisions >= d.cfg.MinDecisions &&
			float64(d.refusals) >= d.cfg.MaxRefusalRatio*float64(d.decisions) {
			overloaded = true
		}
		if d.cfg.MaxQueueAge > 0 {
			if age, _ := c.oldestWait(d.winEnd); max(d.maxWait, age) >= d.cfg.MaxQueueAge {
				overloaded = true
			}
		}
		c.step(overloaded, d.winEnd)
		d.decisions, d.refusals, d.maxWait = 0, 0, 0
		d.winEnd = d.winEnd.Add(w)
		if i > saturate && !now.Before(d.winEnd) && c.skipWindows(now, overloaded) {
			i = 0 // the windows after the skip differ from those before it
		}
	}
}

// peekMode is the effective mode that advance(now) would leave, worked out
// without changing anything: the metrics callback's, since collecting
// metrics must not move the controller (on a test clock it would start
// waiters, drop shed ones and close windows at the collection's time, not
// at the next call's). The windows are closed on the live state and the
// state is then put back; overrides that expire by now end their forced
// mode at their expiry (the windows that end before it are judged under it,
// as advance judges them), and their other limits end there too (the
// live limits are put back afterwards).
func (c *Controller) peekMode(now time.Time) Mode {
	forced := c.ovr.forced
	if len(c.ovr.list) > 0 && !now.Before(c.ovr.nextExpiry) {
		forced = 0
		for _, a := range c.ovr.list {
			if now.Before(a.Expires) && a.Mode != 0 {
				forced = a.Mode // the latest wins, as in applyOverrides
			}
		}
	}
	if forced != 0 {
		return forced
	}
	if c.cfg.stages&StageDegradation == 0 {
		return ModeNormal
	}
	if now.Before(c.deg.winEnd) {
		return c.deg.mode
	}
	type classSaved struct {
		wasStepped                  bool
		unsteppedAt                 time.Time
		tapFolded, tapSteppedFolded [len(tapReasons)]uint64
		slotsCap, queueCap          int
		frozen                      bool
	}
	saved := make([]classSaved, len(c.classes))
	for i, cs := range c.classes {
		saved[i] = classSaved{cs.wasStepped, cs.unsteppedAt, cs.tapFolded, cs.tapSteppedFolded, cs.slotsCap, cs.queueCap, cs.frozen}
	}
	deg, ovr, pending, traces := c.deg, c.ovr, len(c.pending), len(c.traces)
	// Each expiry by now in turn, as advance does: the windows that end
	// before it are closed under the overrides in force then, and the
	// limits are then those of the ones left (on a list of the peek's own,
	// never the live one's storage).
	if len(c.ovr.list) > 0 && !now.Before(c.ovr.nextExpiry) {
		c.expireOverridesBy(now, make([]ActiveOverride, 0, len(c.ovr.list)), false, func(e time.Time) {
			if c.deg.winEnd.Before(e) {
				c.closeWindows(e.Add(-1))
			}
		})
	}
	c.closeWindows(now)
	m := c.deg.mode
	c.deg, c.ovr = deg, ovr
	clear(c.pending[pending:])
	clear(c.traces[traces:])
	c.pending, c.traces = c.pending[:pending], c.traces[:traces]
	for i, cs := range c.classes {
		s := saved[i]
		cs.wasStepped, cs.unsteppedAt, cs.tapFolded, cs.tapSteppedFolded = s.wasStepped, s.unsteppedAt, s.tapFolded, s.tapSteppedFolded
		cs.slotsCap, cs.queueCap, cs.frozen = s.slotsCap, s.queueCap, s.frozen
	}
	return m
}

// skipWindows moves past the empty windows ending by now that would close as
// the last one did (overloaded or not), which no longer move the saturated
// state machine: all of them, or, when a waiter's age reaches MaxQueueAge in
// the range, those that end before it does, and reports the latter case.
// Nothing starts or leaves a queue while windows roll, so a waiter's age at a
// window's end grows with the window.
func (c *Controller) skipWindows(now time.Time, overloaded bool) (changes bool) {
	d := &c.deg
	w := d.cfg.Window
	until := now // skip the windows ending by until
	if age, waiting := c.oldestWait(d.winEnd); !overloaded && waiting && d.cfg.MaxQueueAge > 0 {
		if cross := d.winEnd.Add(d.cfg.MaxQueueAge - age); !now.Before(cross) {
			until, changes = cross.Add(-1), true // the window ending at or after cross is overloaded
		}
	}
	if until.Before(d.winEnd) {
		return changes
	}
	// k whole windows, bounded so that k·w cannot overflow (a clock read as
	// centuries ahead skips in several steps).
	k := min(until.Sub(d.winEnd)/w+1, time.Duration(math.MaxInt64)/w)
	d.winEnd = d.winEnd.Add(k * w)
	return changes
}

// oldestWait is how long the oldest request waiting outside the control
// class has waited at time at, and whether any such request waits.
func (c *Controller) oldestWait(at time.Time) (oldest time.Duration, waiting bool) {
	for _, cs := range c.classes {
		if cs.cfg.Name == ControlClass || c.stepped(cs) {
			continue // a wait Recovering's step causes is no overload signal
		}
		// Skip the waiters held, now, by their own tenant's running limit
		// alone (their class could start them): one tenant over its limit
		// is not the server's overload.
		w := cs.queue.head
		if w != nil && cs.heldWaiters > 0 && c.acquire(cs, c.slots(cs)) != nil {
			if cs.heldWaiters == cs.queue.n {
				continue
			}
			for w != nil && c.tenantHeld(cs, w) {
				w = w.next
			}
		}
		if w != nil {
			oldest, waiting = max(oldest, at.Sub(maxTime(w.enq, cs.unsteppedAt))), true
		}
	}
	return oldest, waiting
}

// step moves the state machine by one closed window.
func (c *Controller) step(overloaded bool, at time.Time) {
	d := &c.deg
	prev := d.mode
	x := d.cfg.ExitAfter
	switch d.mode {
	case ModeNormal:
		if !overloaded {
			d.over = 0
			break
		}
		d.over++
		if d.over >= d.cfg.EnterAfter {
			d.mode, d.over, d.healthy, d.hold = ModeDegraded, 0, 0, false
		}
	case ModeDegraded, ModeRecovering:
		if overloaded {
			// Overloaded again while recovering: stay Degraded for a whole
			// exit period, so an oscillating load does not re-admit and
			// shed the optional classes every other window.
			d.hold = d.hold || d.mode == ModeRecovering
			d.mode, d.healthy = ModeDegraded, 0
			break
		}
		d.healthy++
		if d.hold {
			if d.healthy < x {
				break // still Degraded
			}
			d.hold, d.healthy = false, 1 // the exit period passed: recover in steps
		}
		if d.healthy >= x {
			d.mode, d.healthy = ModeNormal, 0
		} else {
			d.mode = ModeRecovering
		}
	}
	c.noteSteps(at)
	if d.mode != prev {
		d.transitions++
		c.emitLocked(Event{Kind: EventMode, Mode: d.mode, At: at})
		c.traceLocked(traceEvent{name: "tollgate.admission.mode", mode: d.mode, prev: prev, at: at})
	}
}

// shedQueued refuses, with SHED, the waiting requests of classes that are
// now shed or frozen.
func (c *Controller) shedQueued(now time.Time) {
	for _, cs := range c.classes {
		if !cs.frozen && !c.shedding(cs) {
			continue
		}
		for w := cs.queue.head; w != nil; {
			next := w.next
			c.dropWaiter(w, status.ReasonShed, c.retryAfterLocked(cs, status.ReasonShed, now), now)
			w = next
		}
	}
}

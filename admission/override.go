package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/tollgate-go/tollgate/status"
)

// Override is an operator's temporary change to admission: freeze a class,
// lower its limits, or force a mode. Overrides are bounded: they can only
// lower limits (never raise them past the configuration), never touch the
// control class, expire by themselves after TTL, and at most
// [MaxOverrides] are in force at once. Each carries who set it
// and why; setting, clearing and expiring one are emitted as OpenTelemetry
// span events named "tollgate.admission.override" (on a short span of their
// own, and on the span in SetOverride's or ClearOverride's context, if
// any). Each event carries action ("set", "clear" or "expire"), id (the
// ActiveOverride's ID), actor, reason and expires (RFC 3339, UTC); and only
// the fields the override sets: tollgate.class (when Class is not empty),
// freeze (true, when Freeze is set), slots and queue_items (when positive)
// and mode ("NORMAL", "DEGRADED" or "RECOVERING", when Mode is set).
type Override struct {
	// Actor is who sets the override. Required: at most
	// MaxOverrideTextBytes of valid UTF-8.
	Actor string
	// Reason is why. Required: at most MaxOverrideTextBytes of valid
	// UTF-8.
	Reason string
	// TTL is how long the override lasts; at most the controller's maximum
	// (WithMaxOverrideTTL, default one hour). Required.
	TTL time.Duration
	// Class is the class Freeze, Slots and QueueItems act on.
	Class string
	// Freeze refuses every new request of Class with SHED and drops its
	// waiting requests the same way.
	Freeze bool
	// Slots, when positive, lowers Class's slots to it (at most the
	// configured slots).
	Slots int
	// QueueItems, when positive, lowers Class's queue bound to it (at most
	// the configured bound; use Freeze to refuse everything). The newest
	// waiters beyond the lowered bound are refused with QUEUE_FULL, once
	// those whose context has ended have left (as their contexts say).
	QueueItems int
	// Mode, when set, forces the controller's mode. The state machine keeps
	// observing underneath and takes over again when the override ends.
	Mode Mode
}

// MaxOverrideTextBytes is the longest Actor and the longest Reason
// SetOverride accepts: each is kept while the override is in force and
// emitted on every one of its span events.
const MaxOverrideTextBytes = 256

// ActiveOverride is an override in force.
type ActiveOverride struct {
	Override
	// ID names the override for [Controller.ClearOverride].
	ID uint64
	// Set and Expires are when it was set and when it ends.
	Set, Expires time.Time
}

type overrideState struct {
	list       []ActiveOverride
	nextExpiry time.Time
	nextID     uint64
	forced     Mode
}

// ErrInvalidOverride is wrapped by the errors SetOverride returns for an
// override that is out of bounds or incomplete, or that would put more
// than [MaxOverrides] in force.
var ErrInvalidOverride = errors.New("admission: invalid override")

// MaxOverrides is the most overrides a controller keeps in force at once:
// SetOverride refuses another (wrapping [ErrInvalidOverride]) until one
// expires or is cleared. A call that finds overrides expired (and a
// metrics collection that finds them due) ends them in order of expiry
// under the controller's lock in O(n log n) for n in force; setting or
// clearing one recomputes the limits from all of them, O(n). Operators need few: one per class and
// action, and one forced mode, replacing rather than stacking.
const MaxOverrides = 64

// SetOverride puts o in force now and returns its ID. It returns an error
// wrapping [ErrInvalidOverride] when o lacks an actor, a reason or a
// positive TTL within the maximum, has an actor or reason longer than
// [MaxOverrideTextBytes] or not valid UTF-8, names an unknown class or the
// control class,
// would raise a limit, or sets nothing (an override whose limits equal the
// configured ones is accepted, and changes nothing); or when [MaxOverrides]
// are in force already (the expired ones are dropped first). The event is
// also added to the span in ctx, if any. It acts now: on the controller's
// clock, or, while the controller is driven on a virtual clock (its last
// admission an AdmitAt), at the latest time the caller gave. Safe for
// concurrent use.
func (c *Controller) SetOverride(ctx context.Context, o Override) (uint64, error) {
	if err := c.validateOverride(o); err != nil {
		return 0, err
	}
	c.mu.Lock()
	return c.setOverrideLocked(ctx, o, c.nowLocked())
}

// SetOverrideAt is [Controller.SetOverride] at time now (virtual clocks).
func (c *Controller) SetOverrideAt(ctx context.Context, o Override, now time.Time) (uint64, error) {
	if err := c.validateOverride(o); err != nil {
		return 0, err
	}
	c.mu.Lock()
	return c.setOverrideLocked(ctx, o, now)
}

// setOverrideLocked is SetOverrideAt, for a valid o, with the lock held;
// it unlocks.
func (c *Controller) setOverrideLocked(ctx context.Context, o Override, now time.Time) (uint64, error) {
	c.advance(now)
	if len(c.ovr.list) >= MaxOverrides {
		c.unlock()
		return 0, fmt.Errorf("%w: %d overrides in force, at most %d (MaxOverrides): clear one first", ErrInvalidOverride, len(c.ovr.list), MaxOverrides)
	}
	c.ovr.nextID++
	a := ActiveOverride{Override: o, ID: c.ovr.nextID, Set: now, Expires: now.Add(o.TTL)}
	c.ovr.list = append(c.ovr.list, a)
	c.applyOverrides(now)
	c.traceLocked(traceEvent{name: "tollgate.admission.override", action: "set", ovr: a, at: now, ctx: ctx})
	c.unlock()
	return a.ID, nil
}

// ClearOverride ends the override with the given ID before its expiry and
// reports whether it was in force. It acts now: on the wall clock (the
// controller's own clock), or, while the controller is driven on a virtual
// clock (its last admission an AdmitAt), at the latest time the caller
// gave. Safe for concurrent use.
func (c *Controller) ClearOverride(ctx context.Context, id uint64) bool {
	c.mu.Lock()
	now := c.nowLocked()
	c.advance(now)
	found := false
	for i, a := range c.ovr.list {
		if a.ID == id {
			c.ovr.list = append(c.ovr.list[:i], c.ovr.list[i+1:]...)
			c.traceLocked(traceEvent{name: "tollgate.admission.override", action: "clear", ovr: a, at: now, ctx: ctx})
			found = true
			break
		}
	}
	if found {
		c.applyOverrides(now)
	}
	c.unlock()
	return found
}

// Overrides returns the overrides in force now, oldest first; overrides
// whose TTL has run out are expired first and not listed. Now is the
// controller's clock, or, while the controller is driven on a virtual clock
// (its last admission an AdmitAt), the latest time the caller gave.
func (c *Controller) Overrides() []ActiveOverride {
	c.mu.Lock()
	return c.overridesLocked(c.nowLocked())
}

// OverridesAt is [Controller.Overrides] at time now (virtual clocks).
func (c *Controller) OverridesAt(now time.Time) []ActiveOverride {
	c.mu.Lock()
	return c.overridesLocked(now)
}

// overridesLocked is OverridesAt with the lock held; it unlocks.
func (c *Controller) overridesLocked(now time.Time) []ActiveOverride {
	c.advance(now)
	list := append([]ActiveOverride(nil), c.ovr.list...)
	c.unlock()
	return list
}

func (c *Controller) validateOverride(o Override) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOverride}, args...)...)
	}
	switch {
	case o.Actor == "" || o.Reason == "":
		return bad("actor and reason are required")
	case len(o.Actor) > MaxOverrideTextBytes || len(o.Reason) > MaxOverrideTextBytes:
		return bad("actor of %d bytes, reason of %d: at most %d each (MaxOverrideTextBytes)", len(o.Actor), len(o.Reason), MaxOverrideTextBytes)
	case !utf8.ValidString(o.Actor) || !utf8.ValidString(o.Reason):
		return bad("actor and reason must be valid UTF-8")
	case o.TTL <= 0 || o.TTL > c.cfg.maxTTL:
		return bad("TTL %v outside (0, %v]", o.TTL, c.cfg.maxTTL)
	case !o.Freeze && o.Slots == 0 && o.QueueItems == 0 && o.Mode == 0:
		return bad("sets nothing (no Freeze, Slots, QueueItems or Mode)")
	case o.Mode > ModeRecovering:
		return bad("unknown mode %d", o.Mode)
	case o.Slots < 0 || o.QueueItems < 0:
		return bad("negative limit")
	}
	if o.Freeze || o.Slots > 0 || o.QueueItems > 0 {
		cs, ok := c.byName[o.Class]
		switch {
		case !ok:
			return bad("unknown class %q", o.Class)
		case o.Class == ControlClass:
			return bad("the control class cannot be overridden")
		case o.Slots > cs.cfg.Slots:
			return bad("slots %d above the configured %d", o.Slots, cs.cfg.Slots)
		case o.QueueItems > cs.cfg.QueueItems:
			return bad("queue items %d above the configured %d", o.QueueItems, cs.cfg.QueueItems)
		}
	}
	return nil
}

// expireOverridesBy ends the overrides that end by now, earliest first
// (advance, peekMode): before each expiry time e, before(e) runs under the
// limits in force until e (advance closes there the windows that end before
// it); then the overrides that end at e are dropped (traced, when trace is
// set) and the limits are those of the ones left, as of e (the classes
// Recovering's step no longer holds count their waits from e: noteSteps),
// as setLimits would make them. Acting on them (actOnLimits) is the
// caller's, at its time. The ones left are written, in the order they were
// set, to kept's storage: c.ovr.list's own to filter it in place, or a
// copy's (peekMode, which puts the live list back); c.ovr.list is the list
// left from the start (nothing reads it between the expiries).
//
// The limits after each expiry are worked out backwards, from the ones
// left, adding the overrides in reverse order of expiry (a lowest limit, a
// freeze, the latest forced mode only grow as overrides are added), so
// that n overrides cost O(n log n), and O(classes) each distinct expiry
// time, rather than a walk of the list per expiry.
func (c *Controller) expireOverridesBy(now time.Time, kept []ActiveOverride, trace bool, before func(e time.Time)) {
	var ending []ActiveOverride
	kept = kept[:0]
	for _, a := range c.ovr.list { // kept is written no faster than the list is read
		if now.Before(a.Expires) {
			kept = append(kept, a)
		} else {
			ending = append(ending, a)
		}
	}
	c.ovr.list = kept
	slices.SortStableFunc(ending, func(x, y ActiveOverride) int { return x.Expires.Compare(y.Expires) })
	var starts []int // where each group of ending overrides with one expiry starts
	for i := range ending {
		if i == 0 || !ending[i].Expires.Equal(ending[i-1].Expires) {
			starts = append(starts, i)
		}
	}
	groupEnd := func(j int) int {
		if j+1 < len(starts) {
			return starts[j+1]
		}
		return len(ending)
	}
	type classLimits struct {
		slots, queue int
		frozen       bool
	}
	nc := len(c.classes)
	cur := make([]classLimits, nc)
	for i, cs := range c.classes {
		cur[i] = classLimits{cs.cfg.Slots, cs.cfg.QueueItems, false}
	}
	var forced Mode
	var forcedID uint64 // the latest set forced mode wins (setLimits): IDs grow as overrides are set
	add := func(a ActiveOverride) {
		if a.Mode != 0 && a.ID > forcedID {
			forced, forcedID = a.Mode, a.ID
		}
		cs, ok := c.byName[a.Class]
		if !ok {
			return
		}
		l := &cur[cs.index]
		l.frozen = l.frozen || a.Freeze
		if a.Slots > 0 {
			l.slots = min(l.slots, a.Slots)
		}
		if a.QueueItems > 0 {
			l.queue = min(l.queue, a.QueueItems)
		}
	}
	var next time.Time // the earliest expiry of the ones left
	for _, a := range kept {
		add(a)
		if next.IsZero() || a.Expires.Before(next) {
			next = a.Expires
		}
	}
	// states[j*nc:] (nc entries) and forcedAfter[j]: the limits once the
	// j-th group has ended, filled back to front.
	states := make([]classLimits, nc*len(starts))
	forcedAfter := make([]Mode, len(starts))
	for j := len(starts) - 1; j >= 0; j-- {
		copy(states[j*nc:], cur)
		forcedAfter[j] = forced
		for _, a := range ending[starts[j]:groupEnd(j)] {
			add(a)
		}
	}
	for j, st := range starts {
		e := ending[st].Expires
		if before != nil {
			before(e)
		}
		if trace {
			for _, a := range ending[st:groupEnd(j)] {
				c.traceLocked(traceEvent{name: "tollgate.admission.override", action: "expire", ovr: a, at: a.Expires})
			}
		}
		for i, cs := range c.classes {
			l := states[j*nc+i]
			cs.slotsCap, cs.queueCap, cs.frozen = l.slots, l.queue, l.frozen
		}
		c.ovr.forced = forcedAfter[j]
		c.ovr.nextExpiry = next
		if j+1 < len(starts) {
			c.ovr.nextExpiry = ending[starts[j+1]].Expires
		}
		c.noteSteps(e)
	}
}

// applyOverrides recomputes the effective limits from the overrides in
// force and acts on them at now (actOnLimits).
func (c *Controller) applyOverrides(now time.Time) {
	c.setLimits(now)
	c.actOnLimits(now)
}

// setLimits recomputes the effective limits from the overrides in force,
// as of at (noteSteps).
func (c *Controller) setLimits(at time.Time) {
	for _, cs := range c.classes {
		cs.slotsCap, cs.queueCap, cs.frozen = cs.cfg.Slots, cs.cfg.QueueItems, false
	}
	c.ovr.forced = 0
	c.ovr.nextExpiry = time.Time{}
	for _, a := range c.ovr.list {
		if c.ovr.nextExpiry.IsZero() || a.Expires.Before(c.ovr.nextExpiry) {
			c.ovr.nextExpiry = a.Expires
		}
		if a.Mode != 0 {
			c.ovr.forced = a.Mode
		}
		cs, ok := c.byName[a.Class]
		if !ok {
			continue
		}
		cs.frozen = cs.frozen || a.Freeze
		if a.Slots > 0 {
			cs.slotsCap = min(cs.slotsCap, a.Slots)
		}
		if a.QueueItems > 0 {
			cs.queueCap = min(cs.queueCap, a.QueueItems)
		}
	}
	c.noteSteps(at)
}

// actOnLimits drops, at now, the waiters of frozen or shed classes, starts
// the waiters that the limits in force allow and trims queues over their
// bounds.
func (c *Controller) actOnLimits(now time.Time) {
	c.shedQueued(now)
	c.pump(now)
	c.trimQueues(now)
}

// trimQueues refuses, with QUEUE_FULL, the newest waiters of every class
// whose queue holds more than the bound in force (an override lowered it).
// They never held a permit, so permits still balance. The refusals count in
// the class's stats, not in the degradation window: the operator, not the
// load, made them. Waiters whose callers have gone (goneLocked) leave
// first, as their contexts' endings say: they hold no place a live waiter
// should lose.
func (c *Controller) trimQueues(now time.Time) {
	for _, cs := range c.classes {
		for w := cs.queue.head; w != nil && cs.queue.n > cs.queueCap; {
			next := w.next
			if goneLocked(w) {
				c.decideGoneLocked(w, now)
			}
			w = next
		}
		for cs.queue.n > cs.queueCap {
			c.dropWaiterCounted(cs.queue.tail, status.ReasonQueueFull, c.retryAfterLocked(cs, status.ReasonQueueFull, now), now, false)
		}
	}
}

package admission

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/status"
)

// waiter is a request waiting in its class's queue. The controller's lock
// guards every field but ready, which is closed once, under the lock, when
// decided becomes true.
type waiter struct {
	prev, next *waiter
	cs         *classState
	tenant     string
	tenantOn   bool
	stream     bool // Request.Stream
	size, work int64
	deadline   time.Time
	enq        time.Time
	predicted  time.Duration // the wait predicted when it was queued
	ahead      int           // requests of its class queued ahead of it when it joined
	// ctx is the waiting Admit call's context, set when it joins the queue
	// and never changed: a call that would start the waiter (pumpPass),
	// drop it as unable to finish (expireLocked) or refuse it (a shed, a
	// trim, Close: dropWaiterCounted, trimQueues) looks at it first, as
	// does a sweep for the waiters whose callers have gone
	// (sweepGoneLocked), since
	// a waiter whose caller has gone leaves as its context's ending says,
	// whichever goroutine finds it (goneLocked, decideGoneLocked). It lives
	// only as long as that Admit call waits, and is only read (its error,
	// cause and deadline), never waited on or passed on: the one departure from
	// CONVENTIONS' "context never stored", as a waiter is that call's own
	// state (net/http's Request holds its context the same way).
	ctx context.Context
	// mortal is set when ctx can end (its Done channel is not nil): the
	// waiter counts in its class's mortal, and stop unregisters the
	// AfterFunc that notes its ending (noteGone) once it no longer waits.
	mortal bool
	stop   func() bool
	// state is waiterQueued until its context's AfterFunc notes its ending
	// (waiterGone, counted in its class's gone), and waiterOut once it left
	// its queue (removeWaiter); atomic, as the AfterFunc runs without the
	// lock.
	state atomic.Int32

	ready     chan struct{}
	decided   bool
	permit    *Permit
	err       error
	reason    status.Reason
	cancelled bool // decided as its caller's cancellation (counted cancelled, not refused)
}

// The states of waiter.state.
const (
	waiterQueued int32 = iota
	waiterGone
	waiterOut
)

// sooner returns the earlier of a and b, a zero time standing for none.
func sooner(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// waitList is a FIFO of waiters that can remove any member in O(1).
type waitList struct {
	head, tail *waiter
	n          int
	// soonest is at or before the earliest deadline of the members that
	// have one; zero when none has. A removal leaves it where it was (still
	// a bound); a walk over the whole list sets it exactly. It lets a
	// release skip a queue none of whose members can have expired.
	soonest time.Time
}

func (l *waitList) push(w *waiter) {
	l.soonest = sooner(l.soonest, w.deadline)
	w.prev, w.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.n++
}

func (l *waitList) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next = nil, nil
	l.n--
	if l.n == 0 {
		l.soonest = time.Time{}
	}
}

// rejectRing remembers recent DEADLINE_UNREACHABLE refusals of a class, to
// judge afterwards whether they were false rejects.
type rejectRing struct {
	buf        [64]rejected
	head, size int
}

type rejected struct {
	at, deadline, startBy time.Time
}

// rememberReject records a DEADLINE_UNREACHABLE refusal at now of a request
// with deadline and startBy (Request's fields; zero: none).
func (c *Controller) rememberReject(cs *classState, deadline, startBy, now time.Time) {
	r := &cs.rejects
	if r.size == len(r.buf) {
		r.head = (r.head + 1) % len(r.buf)
		r.size--
	}
	r.buf[(r.head+r.size)%len(r.buf)] = rejected{at: now, deadline: deadline, startBy: startBy}
	r.size++
}

// judgeRejects judges the remembered refusals made no later than a request
// of cs that arrived at arrived and starts at now: had a refused request been
// admitted, it would have been ahead of this one in the FIFO and started by
// now, so it counts as a false reject when now plus the learned mean service
// time is within its deadline, and now is no later than the time it had to
// start by. The estimate is conservative: it may miss false rejects, it
// does not invent them from later arrivals.
func (c *Controller) judgeRejects(cs *classState, arrived, now time.Time) {
	r := &cs.rejects
	for r.size > 0 {
		e := r.buf[r.head]
		if e.at.After(arrived) {
			return
		}
		if (e.deadline.IsZero() || !now.Add(cs.est.meanD()).After(e.deadline)) && (e.startBy.IsZero() || !now.After(e.startBy)) {
			cs.falseRejects++
		}
		r.head = (r.head + 1) % len(r.buf)
		r.size--
	}
}

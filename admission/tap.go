package admission

import (
	"context"
	"time"

	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

var _ tap.ServerInHandle = (*Controller)(nil).TapHandle

// TapHandle is a [tap.ServerInHandle]: it refuses a new stream early, before
// its request is read, when the method's class is flagged full (no free slot
// and the queue at its bound), shed, frozen or draining. It classifies by
// the method patterns only: with a classifier function (WithClassifier),
// which may route a request elsewhere than its method's class, it refuses
// nothing but the control path's own flag, and leaves every other decision to
// Admit. It reads one atomic flag and does not allocate when it lets the
// stream through; the
// interceptor still makes the full decision. A refusal is a NOT_ADMITTED
// status with the class and a jittered retry-after from the class's
// predicted wait; for SHED, from the time until the class can be admitted
// again (an override's end, the degradation windows), never before it; for
// DRAINING, none (see the package documentation). Overrides and windows are evaluated lazily: the first
// call after an override in force may have expired, or after a degradation
// window ended while the controller is not Normal or a class is flagged,
// takes the controller's lock once to bring the state up to date before it
// reads the flag. Its time is the controller's clock, or, while the
// controller is driven on a virtual clock (its last admission an AdmitAt),
// the latest time the caller gave, as for [Controller.Stats]. It also lets requests through
// once a waiter of the full queue may no longer be able to finish (the
// queue's earliest deadline less the service estimate), or once the
// context of a waiter of the full queue, or of a waiter of a class that
// lends its idle slots (LendIdle: it lends none while a waiter stands in
// its queue), has ended (its caller has gone), so that Admit drops or
// takes out that waiter before it judges the queue. grpc-go allows one tap per server: compose it with your
// own by calling it first. Safe for concurrent use.
func (c *Controller) TapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	var cs *classState
	switch {
	case slotless(info.FullMethodName):
		// Health answers from memory, at once, and a reflection session
		// is a stream: tollgate's interceptor gives neither a control
		// slot, so neither is refused for want of one that AttemptService
		// queries waiting on a slow store may hold.
		return ctx, nil
	case c.control != nil && c.cfg.control && isControl(info.FullMethodName):
		cs = c.control
	case c.cfg.classifier != nil:
		return ctx, nil // the classifier may route the request to another class
	default:
		cs = c.classifyMethod(info.FullMethodName)
	}
	r := cs.full.Load()
	if r == 0 {
		return ctx, nil
	}
	if due := c.due.Load(); due != 0 {
		if c.tapNow() >= due {
			// An override may have expired or a window ended since the
			// flag was set: bring the state up to date (once: the next
			// due is later), so that the tap's refusals count in the
			// window they were made in, then read the flag again.
			c.mu.Lock()
			c.advance(c.nowLocked())
			c.unlock()
			if r = cs.full.Load(); r == 0 {
				return ctx, nil
			}
		}
	}
	if h := cs.hopeless.Load(); h != 0 && c.tapNow() > h {
		// A waiter of the full queue may no longer be able to finish:
		// Admit drops it before it judges the queue, and may queue this.
		return ctx, nil
	}
	reason := status.Reason(r)
	if reason == status.ReasonQueueFull && cs.gone.Load() > 0 ||
		(reason == status.ReasonQueueFull || reason == status.ReasonConcurrencyFull) && c.lenderGone.Load() > 0 {
		// A waiter of the full queue has a caller that has gone, or one
		// of a lending class's, which lends nothing while it stands:
		// Admit takes it out before it judges the queue (the lender's
		// idle slot may then start this, or the borrower's head), and
		// may queue or start this.
		return ctx, nil
	}
	var ra time.Duration
	switch reason {
	case status.ReasonDraining:
	case status.ReasonShed:
		ra = c.jitterAfter(max(time.Duration(cs.readmit.Load()-c.tapNow()), 0))
	default:
		ra = c.jitter(time.Duration(cs.hint.Load()))
	}
	if i := tapReasonIndex(reason); i >= 0 {
		cs.tapRefused[i].Add(1)
		if cs.steppedNow.Load() {
			cs.tapStepped[i].Add(1)
		}
	}
	c.m.tapRefused(ctx, cs, reason)
	return ctx, refusal(cs, reason, ra, false)
}

// tapNow is the tap's time in Unix nanoseconds: the controller's clock (the
// real one, or WithClock's); but while the controller is driven on a
// virtual clock (its last admission an AdmitAt), the latest time the caller
// gave, as for the calls without a time of their own (nowLocked), since the
// due and hopeless times it is compared with are the caller's.
func (c *Controller) tapNow() int64 {
	if c.tapVirtual.Load() {
		return c.tapLast.Load()
	}
	return c.cfg.now().UnixNano()
}

// tapReasons are the reasons the tap refuses with.
var tapReasons = [...]status.Reason{status.ReasonQueueFull, status.ReasonConcurrencyFull, status.ReasonShed, status.ReasonDraining}

func tapReasonIndex(r status.Reason) int {
	for i, t := range tapReasons {
		if t == r {
			return i
		}
	}
	return -1
}

// foldTapRefusals counts the tap's refusals made since the last fold into the
// current degradation window, as if Admit had refused them: a class refused
// wholesale at the tap is overloaded like one refused by Admit.
func (c *Controller) foldTapRefusals() {
	for _, cs := range c.classes {
		for i := range tapReasons {
			// Stepped refusals are loaded first: one the tap adds
			// between the two loads counts as unstepped, the safe side.
			st := cs.tapStepped[i].Load()
			n := cs.tapRefused[i].Load()
			ds := st - cs.tapSteppedFolded[i]
			cs.tapSteppedFolded[i] = st
			if d := n - cs.tapFolded[i]; d > ds {
				c.deg.refusedN(cs, tapReasons[i], int(d-ds))
			}
			cs.tapFolded[i] = n
		}
	}
}

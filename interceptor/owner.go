package interceptor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/internal/header"
	"github.com/tollgate-go/tollgate/internal/methodinfo"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// targets keeps, per ClientConn target, the retry budget and whether the
// target was seen to keep no records (its AttemptService is unimplemented).
type targets struct {
	mu sync.Mutex
	m  map[string]*target
}

type target struct {
	budget *budget.RetryBudget // nil: no budget
	// recordlessUntil is when the target's answer that it keeps no
	// records (its query was UNIMPLEMENTED) is next doubted: a time of the
	// client's clock, with time.Now's monotonic reading, so that no
	// wall-clock step ends the mark early; nil until the first mark.
	// Servers behind one target change (a rolling deploy adds a store; one
	// backend lacks it), so the answer is kept only for recordlessFor.
	recordlessUntil atomic.Pointer[time.Time]
	// marks counts the times it was marked so (setRecordless), so that a
	// call can tell, whatever the clock does, that a mark came while it ran.
	marks atomic.Uint64
}

// recordlessFor is how long a target that answered a query UNIMPLEMENTED
// is taken to keep no records: an IDEMPOTENT call in doubt then repeats
// without the query, and asks again once it passed.
const recordlessFor = time.Minute

// lastTarget remembers the target a client's calls went through last, by
// name (as targets keys them), so that the common case (one target per
// DialOptions) finds its retry budget without the mutex and the map, and no
// ClientConn is kept alive by the cache.
type lastTarget struct {
	name string
	t    *target
}

func (c *client) target(cc *grpc.ClientConn) *target {
	name := ""
	if cc != nil {
		name = cc.Target()
	}
	if last := c.lastTarget.Load(); last != nil && last.name == name {
		return last.t
	}
	t := c.targetOf(name)
	c.lastTarget.Store(&lastTarget{name: name, t: t})
	return t
}

func (c *client) targetOf(name string) *target {
	c.targets.mu.Lock()
	defer c.targets.mu.Unlock()
	if t := c.targets.m[name]; t != nil {
		return t
	}
	t := &target{}
	if !c.cfg.noRetryBudget {
		t.budget, _ = budget.NewRetryBudget(c.cfg.retryBudget...) // validated at construction
	}
	if c.targets.m == nil {
		c.targets.m = map[string]*target{}
	}
	c.targets.m[name] = t
	return t
}

func (c *client) recordless(t *target) bool {
	until := t.recordlessUntil.Load()
	return until != nil && c.cfg.now().Before(*until)
}

// setRecordless marks t as keeping no records for recordlessFor; the mark
// is stored before it is counted, so a call that sees the count sees it.
func (c *client) setRecordless(t *target) {
	until := c.cfg.now().Add(recordlessFor)
	t.recordlessUntil.Store(&until)
	t.marks.Add(1)
}

func (c *client) policy(method string) *RetryPolicy {
	if p, ok := c.policies[method]; ok {
		return p
	}
	return &c.cfg.retry
}

// owner drives the tries of one unary call: it is the one mechanism that
// may repeat it (DESIGN.md §3.4, §3.5).
type owner struct {
	c       *client
	cl      *call // the call, with its method and what is known of it
	p       *RetryPolicy
	tgt     *target
	cc      *grpc.ClientConn
	invoker grpc.UnaryInvoker
	// explicit is true for a call named with WithCallKey: its key is a
	// ballot across re-runs, so an ATTEMPT_FENCED refusal moves it on.
	explicit bool
	// loans are the grants of every try sent, for reconciliation from a
	// finished record's cumulative units_spent.
	loans   []*budget.Loan
	loanBuf [3]*budget.Loan // backs loans for the first tries, without an allocation
	// doubt is set once a try was UNKNOWN or met IN_PROGRESS or
	// ATTEMPT_FENCED: from then on only a finished record or a FENCED
	// answer may end the call NOT_ADMITTED.
	doubt bool
	// unqueried is set once a try in doubt was repeated without the query
	// (an IDEMPOTENT call at a callee that keeps no records): a later fence
	// vouches only for the store that answers it.
	unqueried bool
	// unsettled is set once a FENCED answer left the call in doubt
	// (unvouched): an earlier try may have run where no record is kept.
	unsettled bool
	// pushback is the last try's grpc-retry-pushback-ms (see delivery).
	pushback int64
	// verify is set when a resolution found a finished record under an
	// explicit key: the next try, which the store checks against the
	// request's fingerprint, learns the answer. The first such try of a call
	// does not count against its tries (verified); any later one does, so
	// that answers lost again and again cannot repeat the call unbounded.
	verify, verified bool
	// jumped is set once an ATTEMPT_FENCED refusal moved a call keyed
	// explicitly past its fence without counting the refused try: later
	// jumps count (decide).
	jumped bool
	// verifyNext is set when the next try is that first verifying try.
	// Unary calls and streams send it alike (run, and a stream's
	// afterTryLocked): at once, with no backoff and no retry-budget token
	// of its own (the resolution's covers it), and at the origin past a
	// spent allowance (it runs nothing below, DESIGN.md §1, §3.3).
	verifyNext bool
	// verifies is set when the next try is a verifying try, the first or a
	// later one: whether it may be sent is asked again just before it is
	// (unvouchedRepeat), as it is for every later repeat once verified. fenced is set once a resolution found a try
	// fenced, or a try was refused by a fence that covers it
	// (ATTEMPT_FENCED): from then on every repeat is asked so, since the
	// fence vouches for the tries it covers only where records are kept.
	verifies, fenced bool
	// verifyUntil is the end of the resolution's grace that found the
	// record: the verifying try may run until then.
	verifyUntil time.Time
	// committed is set by a stream's owner while it resolves a try it can
	// no longer repeat (a response committed it, or what was sent
	// overflowed the replay buffer), and answered when the callee's
	// response header or message was seen: only then is a record under an
	// explicit key known to be this request's.
	committed, answered bool
	// retry is the tollgate.retry event of the repeat proceed waited for,
	// recorded only once prepare lets that try go (a try refused locally
	// was never about to be sent); retrying says it is pending.
	retry    retryNote
	retrying bool
	// queries counts the resolution queries made for the call (the first
	// maxQueryEvents have an event each); sentQueries those of them that
	// may have left the client (its span's tollgate.queries).
	queries, sentQueries int64
	// follows is the failure the repeat proceed last let go (or the
	// verifying try run sends at once) follows: the call's result if
	// prepare then refuses that try for lack of time, or while the call
	// is in doubt (refusedLocally).
	follows error
	// sent is the number of the last try prepare let go (0: none yet), the
	// try the call's span reports.
	sent uint32
	// callOpts are the caller's call options (with the dial's defaults,
	// which grpc-go merged in before the interceptor); resolution queries
	// carry them less those that report on the caller's own call
	// (queryOptions), computed only when a query is sent.
	callOpts []grpc.CallOption
}

// unary is the unary client interceptor.
func (c *client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if isControl(method) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	start := c.cfg.now()
	opts, onFinish := withoutOnFinish(opts)
	cl, err := c.newCall(ctx, cc, method, start)
	if err != nil {
		runOnFinish(onFinish, err) // as grpc-go runs it for a call that never started
		return err
	}
	_, named := ctx.Value(callNameKey{}).(string)
	w := &cl.w
	*w = owner{c: c, cl: cl, p: c.policy(method),
		tgt: cl.tgt, cc: cc, invoker: invoker, explicit: named}
	w.loans = w.loanBuf[:0]
	ctx, span := c.startSpan(ctx, cl)
	ended := false
	defer func() {
		if !ended { // a panic below the interceptor goes on; the span ends with it
			endSpan(span, cl.s, w.sent, status.OutcomeOf(errPanicBelow))
		}
	}()
	w.callOpts = opts
	n, err := w.run(ctx, start, req, reply, opts)
	endSpan(span, cl.s, n, status.OutcomeOf(err))
	ended = true
	runOnFinish(onFinish, err)
	return err
}

// runOnFinish runs the caller's grpc.OnFinish callbacks with the call's
// result.
func runOnFinish(fs []func(error), err error) {
	for _, f := range fs {
		f(err)
	}
}

// run sends tries until the call has an answer; it returns the number of the
// last try and the call's result. start is when the call began.
func (w *owner) run(ctx context.Context, start time.Time, req, reply any, opts []grpc.CallOption) (uint32, error) {
	c, s, key := w.c, w.cl.s, w.cl.key
	n := uint32(1)
	counted := 0 // tries counted against the policy (fence jumps are not)
	first := true
	var err error
	for {
		counted++
		now := start
		if !first {
			now = c.cfg.now()
		}
		first = false
		if result := w.refuseRepeat(n, err, w.verifyNext); result != nil {
			return w.spanTry(n), result
		}
		pctx, releaseCtx := ctx, func() {}
		if w.verifyNext {
			pctx, releaseCtx = w.verifyContext(ctx)
			defer releaseCtx() // also if the try panics (once per call)
		}
		verifyTry := w.verifyNext
		w.cl.verifying, w.cl.graced = verifyTry, verifyTry
		tctx, t, perr := c.prepare(pctx, w.cl, n, w.p, now)
		w.cl.verifying, w.cl.graced, w.verifyNext = false, false, false
		if perr != nil {
			releaseCtx()
			return w.spanTry(n), w.unprepared(n, perr, verifyTry)
		}
		w.prepared(ctx, n)
		if n == 1 && w.tgt.budget != nil {
			w.tgt.budget.Deposit()
		}
		err = w.invoke(tctx, t, verifyTry, req, reply, opts)
		d := c.finish(s, key, t, err, false)
		w.unsent(n, d, verifyTry)
		releaseCtx()
		c.spent(ctx, trace.SpanFromContext(ctx), s, t)
		w.pushback = t.delivery.pushback.Load()
		if t.loan != nil {
			w.loans = append(w.loans, t.loan)
		}
		o := status.OutcomeOfCall(err, d)
		err = w.typed(n, err, o)
		o = finalTyped(o, err)
		o, err = w.relayed(n, o, err, t)
		c.record(ctx, o, d)
		if failed := w.failedInDoubt(n, err, o, d); failed != nil {
			return n, failed
		}

		next, uncounted, result, done := w.decide(ctx, n, err, o, reply)
		if done {
			return n, result
		}
		err, n = result, next-1 // the loop below moves to next
		if next > header.MaxTry {
			// A fence jumped past the last try the header can carry: no
			// repeat, so no retry-budget token and no backoff either. The
			// result names the last try sent, not the fence.
			return w.spanTry(n), w.conclude(w.spanTry(n), err)
		}
		if uncounted {
			counted--
		}
		if w.verifyNext {
			// The verifying try is answered from the record the
			// resolution found (it runs nothing, and the store checks its
			// fingerprint): sent at once, within the resolution's grace,
			// past the attempt's deadline and the policy's backoff, and at
			// the origin past a spent allowance; the resolution's
			// retry-budget token covers it. Below the origin it takes a
			// unit as any RPC does. Only the caller's cancellation stops
			// it.
			if cancelled(ctx) {
				return w.spanTry(n), w.conclude(w.spanTry(n), err)
			}
			// Announced as any repeat is, once prepare lets it go.
			w.retry, w.retrying = retryNote{reason: status.OutcomeOf(err).Reason}, true
			w.follows = err
		} else if result := w.proceed(ctx, n, counted, err); result != nil {
			return w.spanTry(n), result
		}
		n++
	}
}

// invoke sends try t (verifyTry: the call's first verifying try, which
// withdrew no retry-budget token). A panic below the interceptor goes on
// up, but the try is settled first, as one whose outcome is unknown: its
// per-try context ends, and the grant it lent is refunded if the try was
// never sent, held otherwise — never left reserved in a ledger a caller
// that recovers the panic goes on using —, a repeat never sent gives its
// retry-budget token back (unsent), as a stream's does, and it is recorded
// as any try is (its spend event, tollgate.client.tries).
func (w *owner) invoke(tctx context.Context, t *try, verifyTry bool, req, reply any, opts []grpc.CallOption) error {
	settled := false
	defer func() {
		if !settled {
			d := w.c.finish(w.cl.s, w.cl.key, t, errPanicBelow, false)
			w.unsent(t.n, d, verifyTry)
			w.c.spent(tctx, trace.SpanFromContext(tctx), w.cl.s, t)
			w.c.record(tctx, status.OutcomeOfCall(errPanicBelow, d), d)
		}
	}()
	err := w.invoker(tctx, w.cl.method, req, reply, w.cc, opts...)
	settled = true
	return err
}

// verifyContext is the context of a unary call's verifying try: the
// caller's values, its cancellation, and the deadline of the resolution's
// grace (past the caller's own deadline). done releases it.
func (w *owner) verifyContext(ctx context.Context) (context.Context, func()) {
	vctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), w.verifyUntil)
	stop := context.AfterFunc(ctx, func() {
		if cancelled(ctx) {
			cancel()
		}
	})
	return vctx, func() {
		stop()
		cancel()
	}
}

// errPanicBelow is the outcome of a try whose invoker panicked.
var errPanicBelow = status.OutcomeUnknown(errors.New("interceptor: a panic below the interceptor"))

// unsent gives back the retry-budget token proceed withdrew for repeat n
// (n > 1: every repeat but the call's first verifying try, verify, which
// has none) when it never left the client (d NotSent): the budget bounds
// repeats sent.
func (w *owner) unsent(n uint32, d status.Delivery, verify bool) {
	if n > 1 && !verify && d == status.NotSent && w.tgt.budget != nil {
		w.tgt.budget.Return()
	}
}

// unprepared is the result of a call whose try n prepare refused (perr):
// nothing was sent, so a repeat gives back the retry-budget token proceed
// withdrew for it (the budget bounds retries sent); the call's first
// verifying try (verify), for which none was withdrawn (the resolution's
// covers it), gives none back. A repeat refused for
// lack of time (DEADLINE_UNREACHABLE: its backoff fitted the deadline when
// proceed checked, but the wait ran late), or while the call is in doubt,
// ends the call with the failure it followed (refusedLocally), as when
// proceed finds that no try fits: the last try's own outcome says what
// happened, and a local refusal of a try never sent in its place would
// hide it (a callee's error in doubt, or its refusal's delay and final
// flag). Unary calls and streams alike.
func (w *owner) unprepared(n uint32, perr error, verify bool) error {
	if n > 1 && !verify && w.tgt.budget != nil {
		w.tgt.budget.Return()
	}
	return w.refusedLocally(n, perr, w.follows)
}

// refusedLocally is the result of a call whose try n the client refused
// itself (perr: nothing was sent) after the failure followed (nil for a
// first try). A repeat refused for lack of time ends the call with
// followed (see unprepared); so does any repeat refused while the call is
// in doubt (an ALLOWANCE_EXHAUSTED at the origin once the callee spent
// every unit, or below it for a verifying try): the call is UNKNOWN
// either way, and the callee's error, with its code and the try it names,
// says what may have happened, where the refusal of a try never sent
// would only say that nothing more was sent.
func (w *owner) refusedLocally(n uint32, perr, followed error) error {
	if n > 1 && followed != nil && (w.doubt || status.OutcomeOf(perr).Reason == status.ReasonDeadlineUnreachable) {
		return w.conclude(w.spanTry(n), followed)
	}
	return w.conclude(n, perr)
}

// failedInDoubt returns the result of a call whose try n failed with a
// definite code (o FAILED) while an earlier try's outcome is not known:
// UNKNOWN, since that earlier try may have taken effect and a call's outcome
// combines all its tries (DESIGN.md §3.5). That is so when try n never left
// the client (d NotSent: the client's own failure), and when no record
// speaks for the earlier try (unvouched: it was repeated without the query,
// at a callee that keeps no records, or may have run at a backend without
// one), as when an IDEMPOTENT method's repeat finds ALREADY_EXISTS what the
// lost try made. A method declared NO_SIDE_EFFECTS had no effect to combine.
// It returns nil otherwise.
func (w *owner) failedInDoubt(n uint32, err error, o status.Outcome, d status.Delivery) error {
	if !w.doubt || o.Kind != status.KindFailed {
		return nil
	}
	msg := "interceptor: this try failed before it was sent, and an earlier try's outcome is not known"
	if d != status.NotSent {
		if !w.unvouched() || w.cl.info.Level == methodinfo.NoSideEffects {
			return nil
		}
		msg = "interceptor: this try failed, and an earlier try, which no record speaks for, may have taken effect"
	}
	return status.OutcomeUnknown(err, status.WithAttempt(w.cl.s.ID, w.cl.key, n), status.WithMessage(msg))
}

// relayed returns try n's outcome o and error err as the call reads them: a
// tollgate refusal whose detail names an attempt other than the call's, and
// that came without tollgate-spent, is UNKNOWN. A tollgate server's refusal
// names the attempt of the try it refuses: the caller's, or, for a caller it
// does not trust, one it minted, and then it reports tollgate-spent 0 (the
// admission tap names the caller's). Such a refusal was passed up as it came
// by a server that does not speak tollgate, whose handler ran, and may have
// taken effect, before it called down (DESIGN.md §3.6: NOT_ADMITTED means no
// effect at this tier or below).
func (w *owner) relayed(n uint32, o status.Outcome, err error, t *try) (status.Outcome, error) {
	if o.Kind != status.KindNotAdmitted || o.Detail.GetAttemptId() == "" || o.Detail.GetAttemptId() == w.cl.s.ID {
		return o, err
	}
	if _, reported := t.delivery.reported(); reported || t.delivery.reportedBadly() {
		return o, err
	}
	err = status.OutcomeUnknown(err, status.WithAttempt(w.cl.s.ID, w.cl.key, n),
		status.WithMessage("interceptor: a refusal of another attempt was passed up by a server that does not speak tollgate, whose handler may have taken effect"))
	return status.OutcomeOf(err), err
}

// typed gives an error the client classified from the try's delivery (not
// from a tollgate detail) the detail that says so, naming the attempt, call
// and try: NOT_SENT and CALL_LOST are known only here, and every later step
// (decide, conclude, the caller) must see the same classification.
func (w *owner) typed(n uint32, err error, o status.Outcome) error {
	if err == nil || o.Detail != nil {
		return err
	}
	switch o.Kind {
	case status.KindNotAdmitted:
		// What err's status said is kept (an inner limiter's QuotaFailure),
		// and its suggested delay, jittered and bounded (adoptedDelay),
		// becomes the refusal's own: the status carries one RetryInfo,
		// tollgate's.
		ra, _ := status.RetryAfter(err)
		return status.NotAdmitted(o.Reason, status.WithAttempt(w.cl.s.ID, w.cl.key, n), status.WithMessage(err.Error()),
			status.WithRetryAfter(adoptedDelay(ra)), unitsLeft(w.cl.s), status.WithDetailsOf(err),
			status.Fields{Final: o.Reason == status.ReasonNotSent && overHeaderListLimit(err)})
	case status.KindUnknown:
		return status.OutcomeUnknown(err, status.WithAttempt(w.cl.s.ID, w.cl.key, n), status.WithReason(o.Reason))
	}
	return err
}

// overHeaderListLimit reports whether err is grpc-go's refusal to send a
// request whose header list is over the limit its server advertised
// (SETTINGS_MAX_HEADER_LIST_SIZE, which interceptor.ServerOptions sets:
// WithMaxHeaderListSize). grpc-go raises it before the request leaves the
// client, as INTERNAL, and every repeat of the request carries the same
// metadata: typed makes that NOT_SENT refusal final, so that the owner
// ends the call rather than repeat it until its tries, allowance or retry
// budget run out.
func overHeaderListLimit(err error) bool {
	st, ok := grpcstatus.FromError(err)
	return ok && st.Code() == codes.Internal &&
		strings.HasPrefix(st.Message(), "header list size to send violates the maximum size")
}

// finalTyped is o as the call reads it once typed made err's refusal final
// (overHeaderListLimit): its detail, which decide reads, says so.
func finalTyped(o status.Outcome, err error) status.Outcome {
	if o.Detail == nil && o.Kind == status.KindNotAdmitted && status.IsFinal(err) {
		return status.OutcomeOf(err)
	}
	return o
}

// adoptedDelay is the delay a refusal typed here (NOT_SENT) suggests when
// the error an inner interceptor returned (a client-side limiter's)
// suggested ra, 0 for none. Like admission's own suggestions (DESIGN.md
// §3.6: never a constant that synchronises clients) it is jittered, over a
// span half as long as ra, so that the callers one limiter refused together
// do not all return together; but upwards, uniformly in [ra, 1½ ra), not
// around ra as admission's estimated waits are: a limiter's delay is when
// its quota returns, and a repeat before it (this owner's own, whose
// backoff honours the refusal's delay) would only be refused again, at the
// cost of a try. And it is less than admission.DefaultMaxRetryAfter (a ra
// over ⅔ of that bound is taken as ⅔ of it), since a handler's client's
// refusal travels up as its server's grpc-retry-pushback-ms to callers the
// limiter never saw.
func adoptedDelay(ra time.Duration) time.Duration {
	if ra <= 0 {
		return 0
	}
	ra = min(ra, admission.DefaultMaxRetryAfter*2/3)
	return ra + rand.N(max(ra/2, 1))
}

// verifying reports whether the next try is the call's first verifying try
// (see verify), which does not count against its tries, and clears verify.
func (w *owner) verifying() bool {
	uncounted := w.verify && !w.verified
	w.verified = w.verified || w.verify
	w.verifies = w.verify
	w.verify = false
	w.verifyNext = uncounted
	return uncounted
}

// refuseRepeat is unvouchedRepeat's answer for try n, asked just before it
// is sent after last (unary calls and streams alike); when it refuses the
// try, the retry-budget token proceed withdrew for it goes back (none was
// for the call's first verifying try: verify) and no repeat is announced.
func (w *owner) refuseRepeat(n uint32, last error, verify bool) error {
	result := w.unvouchedRepeat(w.spanTry(n-1), last)
	if result == nil {
		return nil
	}
	if !verify && w.tgt.budget != nil {
		w.tgt.budget.Return() // proceed withdrew a token for a try not sent
	}
	w.retrying = false
	return result
}

// unvouchedRepeat returns the result of a call whose next try (after try
// n's failure last) verifies a record found under its explicit key, or
// repeats a call a resolution found fenced (or a fence refused), when that
// try may not be sent:
// its method has side effects, and its target is now known to keep no
// records at some backends (unvouched), where a verifying try would run the
// handler again, and where the fenced try may have run already (the fence
// vouches only for its own store). resolve asked when the query answered; a
// mark that came since (another call's query, during a backoff) is heeded
// here, just before the try is sent. It returns nil otherwise, and clears
// verifies (fenced and verified stay: a later repeat is asked too). Once a
// resolution found a finished record (verified), every later try is a
// verifying try in all but name, whether or not it counts: a repeat of a
// verifying try refused without effect is answered from that record where
// records are kept, and runs the handler again where none are.
func (w *owner) unvouchedRepeat(n uint32, last error) error {
	verifies := w.verifies || w.verified
	w.verifies = false
	if !verifies && !w.fenced || !w.unvouched() || !w.rerunHarms() {
		return nil
	}
	why := "interceptor: the record under the call's explicit key may be another request's, and its target was found to keep none at some backends before the try that would ask was sent"
	if !verifies {
		why = "interceptor: a try in doubt was fenced where records are kept, but its target was found to keep none at some backends before the repeat was sent"
	}
	return status.OutcomeUnknown(last, status.WithAttempt(w.cl.s.ID, w.cl.key, n), w.ownReason(n, last), status.WithMessage(why))
}

// proceed returns nil when try n+1 may follow try n's failure err, after
// counted tries that count against the policy, having waited for it
// (backoff, retry-after) and paid its retry-budget token; otherwise it
// returns the call's result, which names the last try sent (spanTry).
func (w *owner) proceed(ctx context.Context, n uint32, counted int, err error) error {
	// The call's result, if no repeat follows, names the last try sent:
	// after a fence jump n is the fence, a try never sent.
	last := w.spanTry(n)
	if counted >= w.p.MaxTries || ctx.Err() != nil || w.pushback == stopPushback {
		return w.conclude(last, err) // out of tries, cancelled, or the callee said not to retry
	}
	if w.cc != nil && w.cc.GetState() == connectivity.Shutdown {
		return w.conclude(last, err) // the caller closed the ClientConn: every repeat would fail the same way
	}
	d, ok := w.c.backoff(ctx, w.cl.s, w.p, counted+1, err, time.Duration(max(w.pushback, 0))*time.Millisecond)
	if !ok {
		return w.conclude(last, err) // no useful try fits: no retry-budget token is spent on it
	}
	if unpayable(w.cl.s, n+1) {
		// The allowance refuses the repeat whatever happens meanwhile: no
		// token is spent and no backoff waited for a try never sent.
		return w.refusedLocally(n+1, w.c.exhausted(ctx, w.cl.s, w.cl.key, n+1), err)
	}
	if w.tgt.budget != nil && !w.tgt.budget.Withdraw() {
		return w.budgetExhausted(ctx, last, err)
	}
	w.retry, w.retrying = retryNote{delay: d, reason: status.OutcomeOf(err).Reason}, true
	w.follows = err
	if !sleep(ctx, d) {
		// The caller cancelled during the wait: the repeat is never sent,
		// and its token goes back (the budget bounds repeats sent).
		if w.tgt.budget != nil {
			w.tgt.budget.Return()
		}
		w.retrying = false // the repeat was never about to be sent
		return w.conclude(last, err)
	}
	return nil
}

// retryNote is what the tollgate.retry event of a repeat says besides its
// try: why the last try failed, and how long the owner waited.
type retryNote struct {
	delay  time.Duration
	reason status.Reason
}

// prepared notes that prepare let try n go: it is the try the span
// reports, and a repeat's tollgate.retry event is recorded now.
func (w *owner) prepared(ctx context.Context, n uint32) {
	w.sent = n
	if w.retrying {
		w.retrying = false
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.AddEvent(eventRetry, trace.WithAttributes(attrTry.Int64(int64(n)),
				attrEventReason.String(status.ReasonName(w.retry.reason)), attrDelay.Int64(w.retry.delay.Milliseconds())))
		}
	}
}

// spanTry is the try a call's span reports when prepare refused try n: the
// last try sent, or n when none was (the first try, refused locally).
func (w *owner) spanTry(n uint32) uint32 {
	if w.sent == 0 {
		return n
	}
	return w.sent
}

// decide applies DESIGN.md §3.5 to try n's outcome o (err): either the
// call is done with result, or it may go on with try next (uncounted: the
// jump does not count against the policy's tries), result then being what
// to report if no further try can be sent. Unary calls and streams share it.
func (w *owner) decide(ctx context.Context, n uint32, err error, o status.Outcome, reply any) (next uint32, uncounted bool, result error, done bool) {
	s, key := w.cl.s, w.cl.key
	switch o.Kind {
	case status.KindOK, status.KindFailed, status.KindCommitted:
		return 0, false, err, true
	case status.KindUnknown:
		if o.Reason == status.ReasonAttemptUnverifiable && n == 1 && !w.explicit && !w.doubt && names(o.Detail, s.ID, key, n) {
			// Nobody else can have sent the first try of a per-run key, and
			// the server refused it before running anything (its refusal
			// names this try: a handler that ran and passed up a deeper
			// call's is no such proof): the grant it held comes back. A new attempt can succeed, after the
			// callee's retry-after when it sent one (its store began
			// retaining less than the clock skew before this attempt was
			// created).
			w.c.reconciled(ctx, 0, w.loans...)
			return 0, false, status.NotAdmitted(status.ReasonAttemptUnverifiable, status.Fields{
				AttemptID: s.ID, Call: key, Try: n, Final: true,
				RetryAfter: o.Detail.GetRetryAfter().AsDuration(),
				Message: "interceptor: nobody else can have sent this attempt's first try, so it did not run and a new attempt can succeed; " +
					"the callee said: " + strings.TrimPrefix(grpcstatus.Convert(err).Message(), "tollgate: outcome unknown: ")},
				unitsLeft(s), status.WithDetailsOf(err)), true
		}
		if o.Final() {
			return 0, false, w.conclude(n, err), true // the callee says no query or repeat can help
		}
		// Whatever the method's level, this try may have reached the
		// handler: the call can no longer end NOT_ADMITTED by a later
		// refusal (DESIGN.md §3.5: "once any try was UNKNOWN ... only a
		// finished record or a FENCED answer can end the call NOT_ADMITTED").
		w.doubt = true
		if w.cl.info.Level == methodinfo.NoSideEffects {
			return n + 1, false, err, false // repeats freely
		}
		if w.cl.info.Level == methodinfo.Idempotent && w.c.recordless(w.tgt) {
			w.unqueried = true
			return n + 1, false, err, false // IDEMPOTENT at a callee without records: repeat without the query
		}
		next, result, done := w.resolve(ctx, n, err, reply)
		if done {
			return 0, false, result, true
		}
		return next, w.verifying(), result, false
	case status.KindNotAdmitted:
		next, uncounted := n+1, false
		switch o.Reason {
		case status.ReasonAttemptFenced:
			// A fence that covers this try: the call is another owner's
			// business, or this owner's ballot of a try in doubt. One
			// through an earlier try (a server never refuses so) is not a
			// fence of this call: a handler passed up its own call's
			// refusal, re-addressed (DESIGN.md §3.6), and it reads as any
			// refusal without effect.
			if f := o.Detail.GetFencedThroughTry(); f >= n {
				w.doubt = true
				// The fence vouches for the tries it covers only where
				// records are kept, as one this owner's resolution found
				// (resolve): a jump past it is asked so now, and again
				// just before it is sent (unvouchedRepeat).
				w.fenced = true
				if w.unvouched() && w.rerunHarms() {
					return 0, false, status.OutcomeUnknown(err, status.WithAttempt(s.ID, key, n),
						status.WithMessage("interceptor: the try was refused by a fence where records are kept, but its target keeps none at some backends, where a fenced try may have run")), true
				}
				next = min(f, header.MaxTry) + 1 // past MaxTry: the call ends (run)
				// A ballot jump does not count against the tries: the
				// first of a call. Any later one does, so that refusals
				// met again and again (another run's ballots, or a
				// faulty callee) cannot repeat the call unbounded, as
				// with verifying tries.
				uncounted = w.explicit && !w.jumped
				w.jumped = w.jumped || w.explicit
			}
		case status.ReasonAttemptInProgress:
			w.doubt = true
			nx, result, done := w.resolve(ctx, n, err, reply)
			if done {
				return 0, false, result, true
			}
			err, next, uncounted = result, nx, w.verifying()
		case status.ReasonAllowanceExhausted:
			if s.Origin && s.ledger.Snapshot().Total == 0 {
				// The callee needed units an origin with no allowance can
				// never lend it: a repeat is refused the same way (conclude
				// makes it final).
				return 0, false, w.conclude(n, err), true
			}
		}
		// A callee's ALLOWANCE_EXHAUSTED is never final here: only this
		// tier's own ledger can say so (conclude, at the origin).
		if o.Final() && o.Reason != status.ReasonAllowanceExhausted {
			return 0, false, w.conclude(n, err), true
		}
		return next, uncounted, err, false
	}
	return 0, false, w.conclude(n, err), true
}

// conclude is the error a call returns after its last try: once the call
// was in doubt a NOT_ADMITTED ending becomes UNKNOWN (only a finished record
// or a FENCED answer could prove no effect), and at the origin a refusal for
// lack of units becomes final once the allowance is spent.
func (w *owner) conclude(n uint32, err error) error {
	o := status.OutcomeOf(err)
	switch {
	case o.Kind == status.KindNotAdmitted && w.doubt:
		return status.OutcomeUnknown(err, status.WithAttempt(w.cl.s.ID, w.cl.key, n),
			status.WithMessage("interceptor: an earlier try's outcome is not known"))
	case o.Kind == status.KindUnknown && o.Detail == nil:
		// A callee that does not speak tollgate (or a transport error)
		// answered: the caller still gets a typed UNKNOWN naming the attempt,
		// never a bare UNAVAILABLE a generic policy would repeat.
		return status.OutcomeUnknown(err, status.WithAttempt(w.cl.s.ID, w.cl.key, n), status.WithReason(o.Reason))
	}
	return w.c.result(w.cl.s, w.cl.key, n, err, o)
}

func (w *owner) budgetExhausted(ctx context.Context, n uint32, last error) error {
	w.c.tel.budgetExhausted.Add(ctx, 1)
	if w.doubt || status.OutcomeOf(last).Kind == status.KindUnknown {
		// Not resolved for want of a token, which a later query may find:
		// the reason says so, as a NOT_ADMITTED would.
		return status.OutcomeUnknown(last, status.WithAttempt(w.cl.s.ID, w.cl.key, n),
			status.WithReason(status.ReasonRetryBudgetExhausted),
			status.WithMessage("interceptor: retry budget exhausted"))
	}
	// The suggested delay is the later of the callee's (the last try's
	// refusal) and the time the budget's floor takes to earn a token: a
	// new attempt's first try needs none, but a target that drained the
	// budget has been refusing, and the caller is paced as its repeats
	// would be. Jittered upwards and bounded, as any adopted delay.
	ra, _ := status.RetryAfter(last)
	if b := w.tgt.budget; b != nil {
		if d, ok := b.Delay(); ok {
			ra = max(ra, d)
		}
	}
	return status.NotAdmitted(status.ReasonRetryBudgetExhausted, status.Fields{
		AttemptID: w.cl.s.ID, Call: w.cl.key, Try: n,
		Message: "interceptor: retry budget exhausted; last try: " + last.Error(),
	}, unitsLeft(w.cl.s), status.WithRetryAfter(adoptedDelay(ra)), status.WithDetailsOf(last))
}

// resolve learns the state of try n, whose outcome is unknown, by fencing it
// through n on the callee's AttemptService, and polling while the record is
// in progress. It returns done with the call's result when the record
// answers the call; otherwise the try to send next (a FENCED record) and the
// error to report if no try may be sent.
func (w *owner) resolve(ctx context.Context, n uint32, last error, reply any) (next uint32, result error, done bool) {
	c, s := w.c, w.cl.s
	unknown := func(why string) error {
		return status.OutcomeUnknown(last, status.WithAttempt(s.ID, w.cl.key, n), w.ownReason(n, last), status.WithMessage(why))
	}
	if cancelled(ctx) {
		// The caller cancelled: it does not wait for the answer. The query
		// is exempt from the deadline (the caller's context's deadline
		// too, which is the attempt's at the origin), not from the
		// caller's will.
		return 0, unknown("interceptor: the caller stopped waiting before the try's state was known"), true
	}
	// One retry-budget token per resolution, however many polls it takes.
	if w.tgt.budget != nil && !w.tgt.budget.Withdraw() {
		return 0, w.budgetExhausted(ctx, n, last), true
	}
	// The grace runs from the earlier of the attempt's deadline and the
	// caller's own (a call under a longer attempt, or a handler's call with
	// a timeout of its own).
	qctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), s.deadlineIn(ctx).Add(c.cfg.grace))
	defer cancel()
	// The query carries the call's own outgoing metadata (a tenant function
	// may read it) with the tollgate header replaced: the attempt and
	// tenant, no call key.
	h := header.Header{Attempt: s.ID, Tenant: s.Tenant}
	qctx = withHeader(qctx, h.String())
	// Each query's delivery record tells whether it may have left the
	// client, and whether its status came from the peer: a resolution
	// none of whose queries may have left gives its token back, as a
	// repeat never sent does (the budget bounds what is sent to the
	// target).
	sent := false
	unsent := func() {
		if !sent && w.tgt.budget != nil {
			w.tgt.budget.Return()
		}
	}
	req := &tollgatev1.FenceAttemptRequest{AttemptId: s.ID, Call: w.cl.key, Method: w.cl.method, FenceThroughTry: n}
	queryOpts, recvLimit := queryOptions(w.callOpts)
	// Polls wait on wctx, which also ends when the caller cancels (not
	// when its deadline passes: the grace is for that).
	wctx, wcancel := context.WithCancel(qctx)
	defer wcancel()
	defer context.AfterFunc(ctx, func() {
		if cancelled(ctx) {
			wcancel()
		}
	})()
	// The resolution's last query has its event even past maxQueryEvents.
	var lastQuery queryEvent
	defer lastQuery.add(ctx)
	for poll := 1; ; poll++ {
		rec := &tollgatev1.AttemptRecord{}
		// A record per query, so that a late stats event of an earlier
		// poll cannot mark this one's.
		qd := &delivery{}
		qd.reset(fenceMethod, c.statsInstalled, w.cl.seen)
		err := w.invoker(&deliveryCtx{Context: wctx, d: qd}, fenceMethod, req, rec, w.cc, queryOpts...)
		qd.latchRerooted()
		d := qd.state()
		sent = sent || d != status.NotSent
		if err != nil && cancelled(ctx) {
			unsent()
			return 0, unknown("interceptor: the caller stopped waiting before the try's state was known"), true
		}
		state := rec.GetState()
		w.queried(ctx, n, state, err, d != status.NotSent, &lastQuery)
		if err != nil {
			// Only the peer's UNIMPLEMENTED says the callee keeps no
			// records: one the client made before the query left (an
			// inner interceptor's) says nothing of the callee. When the
			// stats handler cannot see the query's own RPC (not
			// installed, or the query was renamed or re-rooted below),
			// its status may be the peer's, as it was taken before.
			if grpcstatus.Code(err) == codes.Unimplemented &&
				(d == status.PeerStatus || (d == status.MaybeSent && !qd.own.Load())) {
				c.setRecordless(w.tgt)
				if w.cl.info.Level == methodinfo.Idempotent {
					w.unqueried = true
					return n + 1, last, false // repeat without the query
				}
			}
			unsent()
			return 0, unknown("interceptor: the try's state could not be queried: " + err.Error()), true
		}
		if rec.GetAttemptId() != s.ID || rec.GetCall() != w.cl.key || rec.GetMethod() != w.cl.method ||
			(state == tollgatev1.AttemptState_ATTEMPT_STATE_FENCED && rec.GetFencedThroughTry() < n) {
			// Not an answer to the question asked: a record of another
			// call, or a fence that does not cover the try in doubt.
			return 0, unknown("interceptor: the callee's AttemptService answered for another call or try"), true
		}
		switch state {
		case tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS:
			if !sleep(wctx, w.p.backoff(poll+1, 0)) {
				if cancelled(ctx) {
					return 0, unknown("interceptor: the caller stopped waiting while the try was in progress"), true
				}
				return 0, unknown("interceptor: the try was still in progress at the deadline"), true
			}
			continue
		case tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, tollgatev1.AttemptState_ATTEMPT_STATE_FAILED:
			w.reconcile(ctx, rec)
			if w.explicit && !w.answered {
				// An explicit key is shared by every run of the calling
				// handler, and the query carries no request: the record
				// may hold another request's result. The next try asks
				// the store, which checks the fingerprint (a mismatch is
				// refused, never replayed). A stream that can no longer
				// send that try, and saw no response that would show the
				// store took its request, cannot tell.
				if w.committed {
					return 0, unknown("interceptor: the record under the call's explicit key may be another request's, and the stream can no longer be repeated to ask"), true
				}
				if w.unvouched() && w.rerunHarms() {
					// The verifying try may reach a backend that keeps no
					// records, which would run the handler again.
					return 0, unknown("interceptor: the record under the call's explicit key may be another request's, and its target keeps none at some backends, so no try may ask"), true
				}
				w.verify = true
				w.verifyUntil = s.deadlineIn(ctx).Add(c.cfg.grace)
				return n + 1, last, false
			}
			if state == tollgatev1.AttemptState_ATTEMPT_STATE_FAILED {
				if w.unqueried || w.unsettled {
					// The record speaks for the tries its store saw; an
					// earlier one, repeated without the query or not
					// vouched for by a fence, may have taken effect where
					// no record is kept (see failedInDoubt).
					return 0, status.OutcomeUnknown(recordError(rec), status.WithAttempt(s.ID, w.cl.key, n),
						status.WithMessage("interceptor: the try failed, and an earlier try, which no record speaks for, may have taken effect")), true
				}
				return 0, recordError(rec), true
			}
			if rec.GetResponseRetained() && !w.cl.info.Stream && len(rec.GetResponse()) <= recvLimit {
				// A response over the call's receive limit is not handed
				// over: grpc-go would have refused it on the try itself.
				if m, ok := reply.(proto.Message); ok {
					if err := proto.Unmarshal(rec.GetResponse(), m); err == nil {
						return 0, nil, true
					}
				}
			}
			return 0, status.Committed(status.WithAttempt(s.ID, w.cl.key, rec.GetTry())), true
		case tollgatev1.AttemptState_ATTEMPT_STATE_FENCED:
			// No try up to the fence ran where this store keeps records; a
			// try repeated without the query may have run where none are
			// kept, and spent the grant it held: neither its doubt nor its
			// grant is settled by this tombstone.
			unvouched := w.unvouched()
			if unvouched && w.rerunHarms() {
				// The fence vouches only for its own store: a try of a
				// method with side effects may have run at a backend that
				// keeps none, and is not repeated.
				return 0, unknown("interceptor: the try was fenced where records are kept, but its target keeps none at some backends"), true
			}
			w.reconcile(ctx, rec)
			w.doubt = unvouched
			w.unsettled = w.unsettled || unvouched
			w.fenced = true // a mark that comes before the repeat is sent is heeded then (unvouchedRepeat)
			f := min(rec.GetFencedThroughTry(), header.MaxTry)
			return max(f, n) + 1, status.NotAdmitted(status.ReasonAttemptFenced, status.Fields{
				AttemptID: s.ID, Call: w.cl.key, Try: n, FencedThroughTry: f,
				Message: "interceptor: the unknown try was fenced and never ran"}, unitsLeft(s), status.WithDetailsOf(last)), false
		default: // ABANDONED, UNKNOWN, UNSEEN (cannot follow a fence) or unknown states
			w.reconcile(ctx, rec) // a record finished UNKNOWN still says what it spent
			return 0, unknown("interceptor: the try's state is " + stateName(state, nil)), true
		}
	}
}

const fenceMethod = "/tollgate.v1.AttemptService/FenceAttempt"

// cancelled reports whether ctx was cancelled, rather than ended by its
// deadline: the caller's will, which a resolution follows, where a deadline
// leaves it its grace.
func cancelled(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.Canceled)
}

// queryOptions keeps the call options a resolution query needs (credentials,
// wait-for-ready, compression…) and drops those that report on the caller's
// own call (its header, trailer, peer, finish callback), which a query must
// not overwrite, and those that choose the call's codec: the caller's codec
// is for its own messages, and AttemptService speaks protobuf. The caller's
// size limits are for its own messages too: an AttemptRecord wraps the
// stored response in more bytes, so the query may receive
// recordOverhead more than the call, and its small request is sent
// whatever the call's send limit. recvLimit is the call's receive limit
// (the last one set, as grpc-go applies them; grpc-go's default when none
// is), which a stored response must fit to be handed over.
func queryOptions(opts []grpc.CallOption) (out []grpc.CallOption, recvLimit int) {
	recvLimit = defaultRecvLimit
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption, grpc.TrailerCallOption, grpc.PeerCallOption, grpc.OnFinishCallOption,
			grpc.ForceCodecCallOption, grpc.ForceCodecV2CallOption, grpc.CustomCodecCallOption, grpc.ContentSubtypeCallOption,
			grpc.MaxSendMsgSizeCallOption:
			continue
		case grpc.MaxRecvMsgSizeCallOption:
			recvLimit = o.MaxRecvMsgSize
			continue
		}
		out = append(out, o)
	}
	return append(out, grpc.MaxCallRecvMsgSize(min(recvLimit, math.MaxInt32-recordOverhead)+recordOverhead)), recvLimit
}

const (
	// defaultRecvLimit is grpc-go's receive limit when none is set.
	defaultRecvLimit = 4 << 20
	// recordOverhead bounds what an AttemptRecord adds to the response it
	// holds: identifiers, method, state, timestamps and a status.
	recordOverhead = 64 << 10
)

// withoutOnFinish returns opts less their grpc.OnFinish options, and those
// options' callbacks. grpc-go runs each once per RPC, so every try would run
// them, the first with a refusal the caller never sees; the owner runs them
// once, with the call's result. opts comes back as it is when it holds none.
func withoutOnFinish(opts []grpc.CallOption) ([]grpc.CallOption, []func(error)) {
	if !slices.ContainsFunc(opts, isOnFinish) {
		return opts, nil
	}
	var fs []func(error)
	out := make([]grpc.CallOption, 0, len(opts)-1)
	for _, o := range opts {
		if f, ok := o.(grpc.OnFinishCallOption); ok {
			fs = append(fs, f.OnFinish)
			continue
		}
		out = append(out, o)
	}
	return out, fs
}

func isOnFinish(o grpc.CallOption) bool {
	_, ok := o.(grpc.OnFinishCallOption)
	return ok
}

// rerunHarms reports whether running the call's handler again may do harm:
// its method is declared neither IDEMPOTENT nor NO_SIDE_EFFECTS.
func (w *owner) rerunHarms() bool {
	l := w.cl.info.Level
	return l != methodinfo.Idempotent && l != methodinfo.NoSideEffects
}

// unvouched reports whether a record of the call's target may not speak for
// every try of the call: a try was repeated without the query, or the
// target was marked as keeping no records while the call ran, so a try
// sent then may have reached a backend without a store (a rolling deploy
// that adds one), which no record of another backend's store covers.
func (w *owner) unvouched() bool {
	return w.unqueried || w.cl.startRecordless || w.tgt.marks.Load() != w.cl.marks
}

// reconcile settles the call's held grants from a finished record.
func (w *owner) reconcile(ctx context.Context, rec *tollgatev1.AttemptRecord) {
	if w.unvouched() {
		// A try may have run where no record is kept, and spent its grant
		// below: this record does not count it, so no grant is settled
		// from it (the safe side).
		return
	}
	switch rec.GetState() {
	case tollgatev1.AttemptState_ATTEMPT_STATE_FENCED:
	case tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, tollgatev1.AttemptState_ATTEMPT_STATE_FAILED,
		tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN:
		if rec.GetFinishedAt() == nil {
			return // not a finished record: nothing to learn
		}
	default:
		// IN_PROGRESS, ABANDONED, UNSEEN or a state this version does not
		// know: whatever its timestamps (an AttemptService of another
		// make may set them), it settles nothing (DESIGN.md §3.3).
		return
	}
	w.c.reconciled(ctx, rec.GetUnitsSpent(), w.loans...)
}

// recordError rebuilds the definite error a FAILED record keeps. A record
// whose code is not definite (which no tollgate server writes: an
// AttemptService or store of another make) is UNKNOWN naming its try, never
// a bare UNAVAILABLE that a generic policy would repeat (DESIGN.md §2.5).
func recordError(rec *tollgatev1.AttemptRecord) error {
	code := codes.Code(rec.GetStatusCode())
	if code == codes.OK {
		code = codes.Unknown
	}
	err := grpcstatus.ErrorProto(&spb.Status{Code: int32(code), Message: rec.GetStatusMessage(), Details: rec.GetStatusDetails()})
	if !status.IsDefinite(code) {
		return status.OutcomeUnknown(err, status.WithAttempt(rec.GetAttemptId(), rec.GetCall(), rec.GetTry()))
	}
	return err
}

// queryEvent is a resolution query's tollgate.attempt.query event, held
// until it is added (pending).
type queryEvent struct {
	n       uint32
	state   tollgatev1.AttemptState
	err     error
	at      time.Time
	pending bool
}

// queried counts a resolution query of try n, which read state or failed
// with err, when it may have been sent (sent: not provably kept on the
// client, as tollgate.client.tries counts tries), in
// tollgate.client.queries and the span's tollgate.queries, and adds its
// tollgate.attempt.query event, sent or not, if it is one of the call's
// first maxQueryEvents; otherwise the event waits in last, which the
// resolution adds when it ends unless a later query replaced it.
func (w *owner) queried(ctx context.Context, n uint32, state tollgatev1.AttemptState, err error, sent bool, last *queryEvent) {
	w.queries++
	if sent {
		w.sentQueries++
		w.c.tel.queries.Add(ctx, 1, queryStateOpt(state, err))
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if sent {
		span.SetAttributes(attrQueries.Int64(w.sentQueries))
	}
	*last = queryEvent{n: n, state: state, err: err, at: time.Now(), pending: true}
	if w.queries <= maxQueryEvents {
		last.add(ctx)
	}
}

// add adds the pending event e to ctx's span, stamped with the time of its
// query: its try, the state read (stateName), and the gRPC code of a query
// that failed (rpc.grpc.status_code).
func (e *queryEvent) add(ctx context.Context) {
	if !e.pending {
		return
	}
	e.pending = false
	attrs := []attribute.KeyValue{attrTry.Int64(int64(e.n)), attrState.String(stateName(e.state, e.err))}
	if e.err != nil {
		attrs = append(attrs, attrRPCCode.Int64(int64(grpcstatus.Code(e.err))))
	}
	trace.SpanFromContext(ctx).AddEvent(eventQuery, trace.WithAttributes(attrs...), trace.WithTimestamp(e.at))
}

// queryStateOpts are the attribute options of tollgate.client.queries, one
// per state this version knows, then QUERY_FAILED and UNRECOGNIZED (a state
// it does not know), built once so that counting allocates nothing.
var queryStateOpts = func() []metric.AddOption {
	n := len(tollgatev1.AttemptState_name)
	opts := make([]metric.AddOption, n+2)
	for v, name := range tollgatev1.AttemptState_name {
		opts[v] = metric.WithAttributeSet(attribute.NewSet(attribute.String("state", name[len("ATTEMPT_STATE_"):])))
	}
	opts[n] = metric.WithAttributeSet(attribute.NewSet(attribute.String("state", "QUERY_FAILED")))
	opts[n+1] = metric.WithAttributeSet(attribute.NewSet(attribute.String("state", "UNRECOGNIZED")))
	return opts
}()

// queryStateOpt is the state attribute of tollgate.client.queries for a
// query that read s or failed with err: a bounded set, whatever a peer
// answers.
func queryStateOpt(s tollgatev1.AttemptState, err error) metric.AddOption {
	n := len(tollgatev1.AttemptState_name)
	switch {
	case err != nil:
		return queryStateOpts[n]
	case s >= 0 && int(s) < n:
		return queryStateOpts[s]
	}
	return queryStateOpts[n+1]
}

// stateName is the state attribute of a tollgate.attempt.query event: the
// record's state without its prefix ("IN_PROGRESS"), QUERY_FAILED for a
// query that failed, or STATE_<n> for a state this version does not know.
func stateName(s tollgatev1.AttemptState, err error) string {
	if err != nil {
		return "QUERY_FAILED"
	}
	name, ok := tollgatev1.AttemptState_name[int32(s)]
	if !ok {
		return fmt.Sprintf("STATE_%d", s)
	}
	return name[len("ATTEMPT_STATE_"):]
}

// ownReason is the option that keeps, in an UNKNOWN outcome the owner
// rebuilds from err (try n's own outcome, re-addressed to name try n), the
// reason err's detail gives when err is UNKNOWN and its detail names try n
// of this call: CALL_LOST, which only the try's delivery tells (typed), or a
// reason its callee gave that very try. A detail that names another call (a
// deeper call's, passed up by a server that does not speak tollgate)
// describes that call: its reason is not carried. It returns nil otherwise,
// which status ignores.
func (w *owner) ownReason(n uint32, err error) status.Option {
	o := status.OutcomeOf(err)
	if o.Kind != status.KindUnknown || o.Reason == status.ReasonUnspecified || !names(o.Detail, w.cl.s.ID, w.cl.key, n) {
		return nil
	}
	return status.WithReason(o.Reason)
}

// names reports whether detail d is about try n of call key in attempt id.
func names(d *tollgatev1.OutcomeDetail, id, key string, n uint32) bool {
	return d.GetAttemptId() == id && d.GetCall() == key && d.GetTry() == n
}

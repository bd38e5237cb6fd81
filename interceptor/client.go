package interceptor

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/internal/header"
	"github.com/tollgate-go/tollgate/internal/methodinfo"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// client holds what tollgate's client interceptors share; built once per
// DialOptions call and safe for concurrent use.
type client struct {
	cfg clientConfig
	tel *clientTelemetry
	// statsInstalled is true when DialOptions installed the stats handler
	// beside the interceptors, so a try without OutHeader was never sent.
	statsInstalled bool
	targets        targets
	lastTarget     atomic.Pointer[lastTarget]
	// statsSeen is set once the stats handler was seen at work for one of
	// this client's tries made without a ClientConn (see delivery.seen);
	// seenConns holds the same flag per ClientConn, for interceptors built
	// by NewClientInterceptors, which a client may install on several
	// connections, with the stats handler on some of them only. Its keys
	// are weak, so that it keeps no closed connection alive; seenAdded
	// counts the entries added, to prune the dead ones now and then.
	statsSeen atomic.Bool
	seenConns sync.Map // weak.Pointer[grpc.ClientConn] → *atomic.Bool
	seenAdded atomic.Uint64
	// policies are WithMethodRetry's policies, validated, by full method.
	policies map[string]*RetryPolicy
}

// isControl reports whether method belongs to the control path (tollgate's
// AttemptService, health, reflection): never charged, never given a call key.
func isControl(method string) bool {
	return strings.HasPrefix(method, attemptServicePrefix) ||
		strings.HasPrefix(method, healthServicePrefix) ||
		strings.HasPrefix(method, reflectionV1Prefix) ||
		strings.HasPrefix(method, reflectionV1AlphaPrefix)
}

// call is one call's state on the client, allocated once per call: the
// attempt it belongs to (its storage used when this client mints it), the
// try being sent and what the stats handler saw of it.
type call struct {
	s      *attemptState
	key    string
	t      try
	minted attemptState
	w      owner // the unary owner's state, in the same allocation
	info   methodinfo.Info
	method string // the call's full method
	// seen is the flag that the stats handler was seen at work on the
	// call's connection (client.seenFor).
	seen *atomic.Bool
	// tryBase is the parent of the first try's context: the ctx the try is
	// prepared with and the delivery record of t, which the stats handler
	// looks up. Written by the first prepare, before anything is sent, and
	// only read after. Every repeat gets a repeatTry of its own, so that a
	// late stats event of an earlier try (the transport reader may deliver
	// its InTrailer after the owner stopped waiting for it) never marks a
	// later try's record.
	tryBase deliveryCtx
	// verifying is set while prepare readies a call's first verifying try
	// (owner.verifyNext), unary or stream: answered from the record, it
	// needs no unit at the origin (originRefuses). graced is set with it
	// for a unary call, whose verifying try runs on the resolution's grace
	// (owner.verifyContext: the context's deadline is the try's); a
	// stream's runs on its caller's context, inside the attempt's deadline.
	verifying, graced bool
	// tgt is the call's target; marks is its count of recordless marks
	// when the call began, and startRecordless whether one held then
	// (owner.unvouched).
	tgt             *target
	marks           uint64
	startRecordless bool
}

// repeatTry is the storage of a repeat's try and its context base: one
// allocation per repeat, none for a call's first try.
type repeatTry struct {
	t    try
	base deliveryCtx
}

// deliveryCtx is a context that carries a try's delivery record for the
// stats handler without an allocation of its own: it lives in the call.
type deliveryCtx struct {
	context.Context
	d *delivery
}

func (c *deliveryCtx) Value(key any) any {
	if _, ok := key.(deliveryKey); ok {
		return c.d
	}
	return c.Context.Value(key)
}

// newCall returns the state of a new call on cc: under the attempt in ctx,
// or a new attempt minted here at now, with its key.
func (c *client) newCall(ctx context.Context, cc *grpc.ClientConn, method string, now time.Time) (*call, error) {
	info := methodinfo.Of(method)
	cl := &call{s: attemptFrom(ctx), info: info, method: method, seen: c.seenFor(cc), tgt: c.target(cc)}
	if cl.marks = cl.tgt.marks.Load(); cl.marks > 0 {
		cl.startRecordless = c.recordless(cl.tgt)
	}
	if cl.s == nil {
		cl.minted.initOrigin(ctx, now, c.cfg.allowance, c.cfg.attemptTimeout)
		cl.s = &cl.minted
	}
	var err error
	cl.key, err = cl.s.callKey(ctx, info.Level)
	return cl, err
}

// seenFor returns the flag that the stats handler was seen at work on cc.
// A client built by DialOptions, which installs the handler on every
// connection it is used on, shares one flag (it is never read there: its
// tries are always tracked).
func (c *client) seenFor(cc *grpc.ClientConn) *atomic.Bool {
	if c.statsInstalled || cc == nil {
		return &c.statsSeen
	}
	key := weak.Make(cc)
	if v, ok := c.seenConns.Load(key); ok {
		return v.(*atomic.Bool)
	}
	v, loaded := c.seenConns.LoadOrStore(key, new(atomic.Bool))
	if !loaded && c.seenAdded.Add(1)%64 == 0 {
		c.seenConns.Range(func(k, _ any) bool {
			if k.(weak.Pointer[grpc.ClientConn]).Value() == nil {
				c.seenConns.Delete(k)
			}
			return true
		})
	}
	return v.(*atomic.Bool)
}

// startSpan starts the tollgate.call span of call cl, named by its
// attempt, its call key and, as the OTel RPC semantic conventions name an
// RPC span's, its method (rpc.system, rpc.service, rpc.method): a call
// refused locally has no RPC span under it to name it.
func (c *client) startSpan(ctx context.Context, cl *call) (context.Context, trace.Span) {
	ctx, span := c.tel.tracer.Start(ctx, "tollgate.call")
	if span.IsRecording() {
		service, method := splitMethod(cl.method)
		span.SetAttributes(attrAttemptID.String(cl.s.ID), attrCall.String(cl.key),
			attrRPCSystem, attrRPCService.String(service), attrRPCMethod.String(method))
	}
	return ctx, span
}

// try is one sending of a call: what was granted, how it ended.
type try struct {
	n        uint32
	charged  bool  // a unit was taken for it
	held     int64 // units of its grant held when it ended (finish)
	loan     *budget.Loan
	delivery delivery
	cancel   context.CancelFunc
}

// prepare readies try n of call key under s: checks that it fits the
// deadline, takes its unit (below the origin), lends its callee's grant, and
// returns the try's context carrying the tollgate header, the shrunk
// deadline and the delivery record. A refusal is local: nothing was sent.
// now is the time the try is prepared at (the call's start for its first
// try, which saves reading the clock twice).
func (c *client) prepare(ctx context.Context, cl *call, n uint32, p *RetryPolicy, now time.Time) (context.Context, *try, error) {
	s, key := cl.s, cl.key
	deadline := s.deadlineIn(ctx).Add(-c.cfg.hopMargin)
	if cl.graced {
		// A unary call's verifying try after a resolution (owner.run):
		// answered from the record, late or not, it may use the
		// resolution's grace, which ctx's deadline is.
		deadline, _ = ctx.Deadline()
	}
	remaining := deadline.Sub(now)
	if remaining < c.cfg.minTryTime {
		// Final only when the attempt's own deadline is what leaves no
		// time. A context that ends before it — below the origin, the
		// caller's per-try grpc-timeout — may leave a later try of the
		// caller the time this one lacks (as the server's tryDeadlineOnly
		// says of admission's DEADLINE_EXPIRED).
		final := s.Deadline.Add(-c.cfg.hopMargin).Sub(now) < c.cfg.minTryTime
		msg := "interceptor: the attempt's deadline leaves no time for a try"
		if !final {
			msg = "interceptor: the context's deadline, before the attempt's, leaves no time for a try"
		}
		return nil, nil, status.NotAdmitted(status.ReasonDeadlineUnreachable, status.Fields{
			AttemptID: s.ID, Call: key, Try: n, Final: final, Message: msg,
		}, unitsLeft(s))
	}
	// The first try uses the call's own storage, a repeat its own (see
	// call.tryBase).
	t, base := &cl.t, &cl.tryBase
	if base.Context != nil {
		r := new(repeatTry)
		t, base = &r.t, &r.base
	}
	t.n, t.charged, t.held, t.loan = n, false, 0, nil
	t.delivery.reset(cl.method, c.statsInstalled, cl.seen)
	if s.Origin {
		// The origin's own tries are not charged; a repeat is pointless once
		// the units below were all spent, and the callee can never be lent
		// one again (DESIGN.md §3.3's seed: the third origin try is refused).
		// An allowance of 0 spends nothing: the origin's call, to a callee
		// that needs no unit, repeats under its policy.
		// A server that minted the attempt sealed its ledger when it
		// answered: a goroutine that outlived its handler sends nothing
		// more (DESIGN.md §3.3: later takes are refused).
		// A verifying try is answered by the record and needs no unit.
		if originRefuses(s.ledger.Snapshot(), n, cl.verifying) {
			return nil, nil, c.exhausted(ctx, s, key, n)
		}
	} else {
		if err := s.ledger.Take(); err != nil {
			return nil, nil, c.exhausted(ctx, s, key, n)
		}
		t.charged = true
	}
	if g, ok := budget.GrantFromContext(ctx); ok {
		t.loan = s.ledger.Lend(g)
	} else {
		var keep int64
		if !s.Origin {
			keep = int64(p.MaxTries) - int64(n)
		}
		t.loan = s.ledger.LendFree(keep)
	}
	h := header.Header{
		Attempt:  s.ID,
		Call:     key,
		Try:      n,
		Deadline: s.Deadline.UnixMilli(),
		Units:    t.loan.Units(),
		Tenant:   s.Tenant,
		Strict:   c.cfg.strict,
	}
	if wait := p.perTry(int(n), remaining); wait < remaining {
		deadline = now.Add(wait)
	}
	*base = deliveryCtx{Context: ctx, d: &t.delivery}
	tctx, cancel := context.WithDeadline(base, deadline)
	t.cancel = cancel
	tctx = withHeader(tctx, h.String())
	return tctx, t, nil
}

// spent records how try t spent once finish knows whether its unit was
// spent: its tollgate.allowance.spend event on the call's span (units 1 for
// a try below the origin that may have reached its callee, 0 for the
// origin's own tries and for a try that never left the client, whose unit
// went back; the grant it lent; and the units free once it ended), and the
// metrics tollgate.allowance.spent (its unit) and tollgate.allowance.held
// (the grant held because its ending proved nothing).
func (c *client) spent(ctx context.Context, span trace.Span, s *attemptState, t *try) {
	if t.charged {
		c.tel.spent.Add(ctx, 1)
	}
	if t.held > 0 {
		c.tel.held.Add(ctx, t.held)
	}
	if span.IsRecording() {
		span.AddEvent(eventSpend, trace.WithAttributes(
			attrTry.Int64(int64(t.n)), attrUnits.Int64(boolInt(t.charged)), attrGranted.Int64(t.loan.Units()),
			attrRemaining.Int64(s.ledger.Free())))
	}
}

// reconciled reconciles the loans of one call's tries from a finished
// record's unitsSpent (budget.ReconcileCallHeld) and counts in
// tollgate.allowance.reconciled the held units it settled, those the record
// says were spent as well as those it frees: each held unit
// once, when it leaves the ledger's held pile, and none that a sealed
// ledger keeps held.
func (c *client) reconciled(ctx context.Context, unitsSpent int64, loans ...*budget.Loan) {
	if _, held := budget.ReconcileCallHeld(unitsSpent, loans...); held > 0 {
		c.tel.reconciled.Add(ctx, held)
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// originFinal reports whether an origin's ledger, as snap shows it, makes a
// refusal for lack of units final (DESIGN.md §3.3): its allowance is spent,
// or it was sealed when the server that minted the attempt answered (no
// call under it can ever be sent again).
func originFinal(snap budget.Snapshot) bool {
	return snap.Origin && (snap.Spent >= snap.Total || snap.Sealed)
}

// unitsLeft is the units_remaining of a refusal the client builds itself
// for a call under s (DESIGN.md §2.4): the free units of the attempt's
// ledger at this tier, as an ALLOWANCE_EXHAUSTED refusal reports them
// (exhausted), and none once the ledger is sealed (its free units went back
// to its caller with the handler's answer): nil then, which status ignores.
// It reads the ledger under its lock: for refusal paths only.
func unitsLeft(s *attemptState) status.Option {
	snap := s.ledger.Snapshot()
	if snap.Sealed {
		return nil
	}
	return status.WithUnitsRemaining(snap.Free)
}

// exhausted builds the local ALLOWANCE_EXHAUSTED refusal of try n and counts
// it. A sealed ledger's free units went back to its caller: none remain.
func (c *client) exhausted(ctx context.Context, s *attemptState, key string, n uint32) error {
	snap := s.ledger.Snapshot()
	c.tel.exhausted.Add(ctx, 1)
	f := status.Fields{
		AttemptID: s.ID, Call: key, Try: n,
		Final:   originFinal(snap),
		Message: "interceptor: the attempt's allowance has no free unit",
	}
	if snap.Sealed {
		f.Message = "interceptor: the handler's allowance was sealed when it answered"
		return status.NotAdmitted(status.ReasonAllowanceExhausted, f)
	}
	return status.NotAdmitted(status.ReasonAllowanceExhausted, f, status.WithUnitsRemaining(snap.Free))
}

// unpayable reports whether prepare is sure to refuse try n of a call under
// s ALLOWANCE_EXHAUSTED, whatever happens meanwhile: the ledger is sealed
// (below the origin, or at a server that minted the attempt); at the
// origin, a repeat once every unit below was spent.
// The owner asks before it spends a retry-budget token and waits a backoff
// for a repeat. An unsealed ledger below the origin with no unit free may
// still get one back (a sibling's try found never sent, a grant refunded):
// the owner waits, and gives the token back if prepare then refuses.
func unpayable(s *attemptState, n uint32) bool {
	snap := s.ledger.Snapshot()
	if s.Origin {
		return originRefuses(snap, n, false)
	}
	return snap.Sealed
}

// originRefuses reports whether an origin whose ledger snap shows refuses
// its own try n (prepare): its ledger is sealed (a server that minted the
// attempt answered), or n is a repeat, other than a verifying try, once a
// non-zero allowance is all spent.
func originRefuses(snap budget.Snapshot, n uint32, verifying bool) bool {
	return snap.Sealed || (n > 1 && !verifying && snap.Total > 0 && snap.Spent >= snap.Total)
}

// finish ends try t with err: it settles the callee's grant as DESIGN.md
// §2.3 says and returns what the client knows of the try's delivery. local
// is set when err is the client's own (a stream's SendMsg refused below
// tollgate) rather than how the try ended: a peer's status that arrived
// unread then proves nothing, and the try counts as maybe sent.
func (c *client) finish(s *attemptState, key string, t *try, err error, local bool) status.Delivery {
	t.cancel()
	t.delivery.latchRerooted()
	d := t.delivery.state()
	if local && d == status.PeerStatus {
		d = status.MaybeSent
	}
	if spent, ok := t.delivery.reported(); ok {
		t.loan.Settle(spent)
		return d
	}
	if t.delivery.reportedBadly() {
		t.hold() // the callee reported, but what cannot be read
		return d
	}
	switch d {
	case status.NotSent:
		t.loan.Refund()
		if t.charged {
			s.ledger.Unsend()
			t.charged = false // its unit went back
		}
	case status.PeerStatus:
		if !c.cfg.strict && spentNothing(err, s.ID, key, t.n) {
			t.loan.Refund()
		} else {
			t.hold()
		}
	default:
		t.hold()
	}
	return d
}

// hold holds t's grant, which its ending did not settle, and notes its
// units for tollgate.allowance.held.
func (t *try) hold() {
	if t.loan.Hold() {
		t.held = t.loan.Units()
	}
}

// spentNothing reports whether a call that ended with the peer's status and
// no tollgate-spent trailer proves, in lenient accounting, that the callee
// spent nothing: it ended OK, with a definite code, or with a tollgate
// refusal or COMMITTED answer whose detail names this attempt, call and try.
// A COMMITTED answer (FAILED_PRECONDITION, a definite code) comes from a
// record that cannot replay a stream's messages, or from a stream whose
// handler ran: a tollgate callee reports what the latter spent whenever it
// is more than 0, and the former ran nothing.
func spentNothing(err error, attempt, key string, n uint32) bool {
	if err == nil {
		return true
	}
	o := status.OutcomeOfCall(err, status.PeerStatus)
	if o.Detail == nil {
		return o.Kind == status.KindFailed
	}
	d := o.Detail
	settled := o.Kind == status.KindNotAdmitted || o.Kind == status.KindCommitted ||
		o.Reason == status.ReasonAttemptRequestMismatch
	return settled && names(d, attempt, key, n)
}

// withHeader sets the tollgate header of the outgoing metadata, replacing
// any value already there (a gateway that forwards incoming metadata must not
// produce two).
func withHeader(ctx context.Context, value string) context.Context {
	// ValueFromOutgoingContext looks without copying the caller's metadata;
	// only a context that already carries a header pays for the copy.
	if len(metadata.ValueFromOutgoingContext(ctx, headerKey)) > 0 {
		md, _ := metadata.FromOutgoingContext(ctx)
		md.Set(headerKey, value) // FromOutgoingContext returned a copy
		return metadata.NewOutgoingContext(ctx, md)
	}
	return metadata.AppendToOutgoingContext(ctx, headerKey, value)
}

// backoff is the wait before the next try (the next-th counted against the
// policy, which sets the backoff), honouring the refusal's retry-after (its
// RetryInfo or detail, or the grpc-retry-pushback-ms trailer); ok is false
// when the wait would not leave a useful try before the deadline.
func (c *client) backoff(ctx context.Context, s *attemptState, p *RetryPolicy, next int, err error, pushback time.Duration) (d time.Duration, ok bool) {
	retryAfter, _ := status.RetryAfter(err)
	d = p.backoff(next, max(retryAfter, pushback))
	return d, !c.cfg.now().Add(d).Add(c.cfg.hopMargin + c.cfg.minTryTime).After(s.deadlineIn(ctx))
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// record counts a try that may have been sent (d) in tollgate.client.tries,
// by outcome. Local refusals, and tries that never left the client, sent
// nothing and are not counted.
func (c *client) record(ctx context.Context, o status.Outcome, d status.Delivery) {
	if d != status.NotSent && int(o.Kind) < len(outcomeOpts) {
		c.tel.tries.Add(ctx, 1, outcomeOpts[o.Kind]...)
	}
}

// outcomeOpts are the attribute options of tollgate.client.tries, one per
// Kind, built once so that recording allocates nothing.
var outcomeOpts = func() [5][]metric.AddOption {
	var opts [5][]metric.AddOption
	for k := status.KindOK; k <= status.KindCommitted; k++ {
		opts[k] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", k.String())))}
	}
	return opts
}()

// endSpan closes the call's span with its result: its last try, outcome,
// reason and class, its ledger's allowance, spent and held units, and,
// for any outcome but OK, span status Error described by the outcome and
// its reason (or, without one, its gRPC code), as an OTel RPC client span
// is for a call that did not succeed.
func endSpan(span trace.Span, s *attemptState, n uint32, o status.Outcome) {
	if span.IsRecording() {
		snap := s.ledger.Snapshot()
		span.SetAttributes(attrTry.Int64(int64(n)), attrOutcome.String(o.Kind.String()),
			attrGranted.Int64(snap.Total), attrSpent.Int64(snap.Spent), attrHeld.Int64(snap.Held))
		if o.Reason != status.ReasonUnspecified {
			span.SetAttributes(attrReason.String(status.ReasonName(o.Reason)))
		}
		if class := o.Detail.GetWorkloadClass(); class != "" {
			span.SetAttributes(attrClass.String(class))
		}
		if o.Kind != status.KindOK {
			span.SetStatus(codes.Error, spanDescription(o))
		}
	}
	span.End()
}

// spanDescription is the short description of a call's span status when it
// did not end OK: its outcome and its reason ("NOT_ADMITTED QUEUE_FULL"),
// or, without a reason, its gRPC code ("FAILED NOT_FOUND").
func spanDescription(o status.Outcome) string {
	if o.Reason != status.ReasonUnspecified {
		return o.Kind.String() + " " + status.ReasonName(o.Reason)
	}
	return o.Kind.String() + " " + codeName(o.Code)
}

// codeName is a gRPC code's name as the protocol spells it ("NOT_FOUND").
func codeName(c grpccodes.Code) string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "CODE_" + strconv.Itoa(int(c))
}

var codeNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

// splitMethod splits a full method name, "/pkg.Service/Method" (or the
// same without its leading slash, which a caller may give Invoke), into its
// service and method; a name of another form is all method.
func splitMethod(full string) (service, method string) {
	name := strings.TrimPrefix(full, "/")
	if i := strings.LastIndexByte(name, '/'); i > 0 {
		return name[:i], name[i+1:]
	}
	return "", name
}

// result is the error a call returns after its last try: a refusal for
// lack of units, the caller's own or its callee's, is final exactly when
// DESIGN.md §3.3 says, at the origin once the allowance is spent, whatever
// the callee said (a callee that minted an attempt of its own may have
// spent all of that one's).
func (c *client) result(s *attemptState, key string, n uint32, err error, o status.Outcome) error {
	if err == nil || o.Kind != status.KindNotAdmitted || o.Reason != status.ReasonAllowanceExhausted {
		return err
	}
	snap := s.ledger.Snapshot()
	final := s.Origin && originFinal(snap)
	if final == o.Final() {
		return err
	}
	// Only the flag changes: the refusal keeps its message, its suggested
	// delay, its class and the details its status carried besides
	// tollgate's.
	msg := refusalMessage(err, status.ReasonAllowanceExhausted)
	if msg == "" && final {
		msg = "interceptor: the attempt's allowance is spent"
	}
	return status.NotAdmitted(status.ReasonAllowanceExhausted, status.Fields{
		AttemptID: s.ID, Call: key, Try: n, Final: final, Message: msg,
		RetryAfter: refusalDelay(err, o, final), Class: o.Detail.GetWorkloadClass(),
	}, status.WithUnitsRemaining(snap.Free), status.WithDetailsOf(err))
}

// refusalDelay is the delay a refusal rebuilt from err (outcome o) suggests,
// carried as its one RetryInfo: its own tollgate detail's when that
// suggests one, or when the refusal is final (a RetryInfo another layer
// added would invite a repeat no repeat can change, and turn
// grpc-retry-pushback-ms -1 into a delay); otherwise the delay another
// layer's RetryInfo suggested, adopted as a NOT_SENT refusal adopts a
// limiter's (adoptedDelay: bounded and jittered, since this refusal
// travels on, to callers that layer never saw, as grpc-retry-pushback-ms).
func refusalDelay(err error, o status.Outcome, final bool) time.Duration {
	if own := o.Detail.GetRetryAfter().AsDuration(); own > 0 || final {
		return max(own, 0)
	}
	ra, _ := status.RetryAfter(err)
	return adoptedDelay(ra)
}

// refusalMessage is the message a NOT_ADMITTED err with reason r was built
// with, without the prefix status.NotAdmitted puts before it (and will put
// again when the refusal is rebuilt): "" when it has none.
func refusalMessage(err error, r status.Reason) string {
	prefix := grpcstatus.Convert(status.NotAdmitted(r)).Message()
	msg := grpcstatus.Convert(err).Message()
	if rest, ok := strings.CutPrefix(msg, prefix); ok {
		return strings.TrimPrefix(rest, ": ")
	}
	return msg
}

// stream is the stream client interceptor: the owner of a stream call, as
// unary is of a unary one (DESIGN.md §3.4, §3.5). It sends the stream's first
// try and returns a clientStream that repeats it, transparently, while no
// response commits it; stream_owner.go says when.
func (c *client) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if isControl(method) {
		return streamer(ctx, desc, cc, method, opts...)
	}
	opts, onFinish := withoutOnFinish(opts)
	cl, err := c.newCall(ctx, cc, method, c.cfg.now())
	if err != nil {
		runOnFinish(onFinish, err) // as grpc-go runs it for a stream that never started
		return nil, err
	}
	cs := newClientStream(ctx, c, cl, desc, cc, method, streamer, opts)
	cs.onFinish = onFinish
	ctx, cs.span = c.startSpan(ctx, cl)
	cs.ctx = ctx
	cs.mu.Lock()
	defer cs.mu.Unlock()
	returned := false
	defer func() {
		if !returned && !cs.done { // a panic below the interceptor goes on; the span ends, once
			cs.span.End()
		}
	}()
	if !cs.tryFromLocked(1) {
		returned = true
		return nil, cs.final
	}
	cs.stop = context.AfterFunc(ctx, cs.abandon)
	returned = true
	return cs, nil
}

// clientStream is the stream the caller sees: one stream over the tries of
// its call. It keeps what the caller sent (within StreamReplayLimit) so that
// a try that fails before a response commits it is repeated and replayed
// inside RecvMsg, SendMsg or Header; each try's grant is settled when the
// try ends, the span when the stream does. Its methods follow
// grpc.ClientStream's concurrency rules (one goroutine sending, one
// receiving); they are in stream_owner.go.
type clientStream struct {
	w        *owner        // the call's owner: classification, resolution, budget
	onFinish []func(error) // the caller's grpc.OnFinish callbacks, run once when the stream ends
	ctx      context.Context
	span     trace.Span
	desc     *grpc.StreamDesc
	streamer grpc.Streamer
	opts     []grpc.CallOption
	// p is the call's retry policy, its per-try timeout lifted (a stream's
	// length is the caller's).
	p RetryPolicy
	// headerCommits: a response header ends replay (client and bidi
	// streaming, unless the method is NO_SIDE_EFFECTS).
	headerCommits bool
	// unaryResponse is true for client-streaming calls: their one response
	// message ends the stream (grpc-go reads the status before returning it).
	unaryResponse bool

	mu   sync.Mutex
	cond sync.Cond // L is &mu; broadcast when receiving or a replay stops, or a try ends
	// The current try: its stream, its state, its number, a generation
	// counted per try sent.
	cur grpc.ClientStream
	// callerCtx is the context Context hands out, made on its first call:
	// it lives as long as the stream, across repeats, and is cancelled when
	// the stream ends or is released (ctxEnded).
	callerCtx atomic.Pointer[cancelableCtx]
	ctxEnded  atomic.Bool
	t         *try
	n         uint32
	gen       uint64
	// settled is set once the current try was settled (finishLocked), until
	// the next try starts: a panic that passes later must not settle it
	// again (panickedLocked).
	settled bool
	// released is set when the stream's bookkeeping ended (releaseLocked)
	// while the caller may still read it: its context ended, or its
	// ClientConn closed, after the try's status arrived, unread; or the
	// try's deadline cut it while nothing read it (expireLocked). The stream
	// still answers the caller's reads.
	released bool
	// kept is the result a stream was released with at its try's deadline
	// (keptSet): its reads end with it once they have had the messages that
	// came before the cut, rather than with a second resolution.
	kept    error
	keptSet bool
	// unreadEnd is a try's end tryFinished saw while a RecvMsg was under
	// way; that RecvMsg applies it if it returned a message instead.
	unreadEnd tryEnd
	counted   int // tries counted against the policy (fence jumps are not)
	// verifyTry is set when the current try is the call's first verifying
	// try (owner.verifyNext), for which no retry-budget token was withdrawn:
	// none goes back if it was never sent.
	verifyTry bool
	// What the caller sent, for replay: clones of its messages, their size.
	// overflow: replay is off for good (the limit was passed or a message
	// could not be kept).
	buf      []any
	bufBytes int
	overflow bool
	// side is whether the caller closed its side, and the stream CloseSend
	// and Trailer act on, under a lock of its own (stream_owner.go).
	side streamSide
	// header and message: a response header or message arrived on some try.
	header, message bool
	// receiving is true while RecvMsg waits on cur without the lock: only
	// it may then read cur's status.
	receiving bool
	// replaying is true while a goroutine replays what the caller sent on
	// the current try's stream (replayLocked): SendMsg waits for it, so that
	// messages keep their order and one goroutine sends at a time.
	replaying bool
	// ownCodec is set when the call's options choose its codec: tollgate
	// then reads no message ahead of the caller (see drainLocked).
	ownCodec bool
	// headerRead is set once the caller read a try's header with Header():
	// the stream is committed to that try.
	headerRead bool
	// pending are response messages read on the caller's behalf (by a
	// probe, or by drainLocked reading up to a status that had arrived),
	// in order: RecvMsg returns them before anything else.
	pending []any
	done    bool
	final   error // the stream's result once done (io.EOF for OK)
	// stop unregisters abandon from the caller's context.
	stop func() bool
}

package interceptor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/internal/ctxkey"
	"github.com/tollgate-go/tollgate/internal/header"
	"github.com/tollgate-go/tollgate/internal/methodinfo"
	"github.com/tollgate-go/tollgate/internal/tenant"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"
)

// server holds what tollgate's server interceptors share; built once per
// ServerOptions call and safe for concurrent use.
type server struct {
	cfg serverConfig
	tel *serverTelemetry
	// replies remembers, by method, the Go type of the responses this
	// server's handlers returned for methods the protobuf registry does not
	// know (a hand-written grpc.ServiceDesc), so that a record's response
	// can be replayed as one; see responseTypes.
	replies responseTypes
}

var (
	malformedTrusted   = metric.WithAttributeSet(attribute.NewSet(attribute.Bool("trusted", true)))
	malformedUntrusted = metric.WithAttributeSet(attribute.NewSet(attribute.Bool("trusted", false)))
)

// inbound is what the server learned of a request before running it.
type inbound struct {
	st     attemptState // storage of s
	s      *attemptState
	strict bool      // the caller asked for strict accounting (r=1)
	until  time.Time // the handler's deadline
	info   methodinfo.Info
	// unhonored is set when a caller sent a header this server does not
	// honour (untrusted, or malformed and ignored): its grant is not used
	// here, and the answer reports tollgate-spent 0, so that a tollgate
	// caller reads a refusal under the attempt minted here as this
	// server's own, not as one a server that does not speak tollgate
	// passed up (owner.relayed).
	unhonored bool
	// honored is set when the caller's header was honoured (a trusted
	// peer's, well-formed): a tollgate caller whose grant this server uses,
	// told tollgate-spent on every UNKNOWN answer (trailer).
	honored bool
	// foreign is set when the request carried a header this server does
	// not honour (untrusted, or malformed and ignored): the handler's
	// context goes without it (withoutHeader).
	foreign bool
	// capped is set when the attempt's deadline (s.Deadline) is the
	// server's maximum from this request's arrival (WithMaxAttemptTime),
	// earlier than the caller's own, which own then holds (zero: the caller
	// set none). A repeat arrives under a later cap, so losing this one is
	// the try's loss, not the attempt's (tryDeadlineOnly).
	capped bool
	own    time.Time
	// serverLimit is set when the handler's deadline is the server's own
	// maximum, earlier than every deadline the request carried (its
	// grpc-timeout, its header's d plus the skew): this server's cap
	// (capped), or the admission tap's, from the tap's now, which bounded
	// the context: a stream that runs to it missed no deadline the request
	// carried — the server ended it by its own limit — and is no run miss
	// (the stream interceptor abandons its permit rather than EndStream).
	serverLimit bool
	// peerDeadline is set when the attempt's deadline (or own) is the one
	// the caller's header gave (d), set on the caller's clock, which may
	// differ from this server's by up to the skew; not when it is the
	// request's own deadline, read on this server's clock as the try's is
	// (tryDeadlineOnly).
	peerDeadline bool
	// expired is set for a recorded call whose try came after the attempt's
	// deadline plus skew: only its record may answer it.
	expired bool
	// missCounted is set once the interceptor has counted the try in
	// tollgate.deadline.misses (lateRefusal, contextEnded): a late try's
	// lookup permit is then abandoned when its context has ended, and
	// otherwise released with ReleaseMissCounted, so that admission does
	// not count it again as a run miss (endLookup).
	missCounted bool
	// detached is set for a recorded unary call: its handler runs on a
	// context detached from the client's, until the attempt's deadline
	// plus the skew (server.detach), whatever the try's own deadline.
	detached bool
	// hctx is the storage of the handler's context (handlerContext).
	hctx handlerCtx
	// spentValue is the storage of the tollgate-spent trailer's value
	// slice: grpc-go copies a trailer when it is set, and nothing writes
	// the slice after.
	spentValue [1]string
}

// runsUntil is the deadline the handler runs until: the attempt's plus the
// skew for a detached (recorded unary) call, whose owner learns its outcome
// from its record however soon the try's own deadline passes (DESIGN.md
// §3.1: a per-try timeout only stops the client waiting); the try's own
// otherwise. Admission judges by it whether the request can finish.
func (sv *server) runsUntil(in *inbound) time.Time {
	if in.detached {
		return in.s.Deadline.Add(sv.cfg.skew)
	}
	return in.until
}

// begin reads the request's tollgate header and returns the attempt it runs
// under: the caller's (trusted peer, well-formed header) or a new one minted
// here. It refuses a trusted peer's malformed header (nil inbound) and a try
// past the attempt's deadline (with the inbound, so the refusal still
// reports tollgate-spent to a strict caller).
func (sv *server) begin(ctx context.Context, method string) (*inbound, error) {
	now := sv.cfg.now()
	in := &inbound{info: methodinfo.Of(method)}
	var (
		h       header.Header
		honored bool
	)
	if vs := metadata.ValueFromIncomingContext(ctx, headerKey); len(vs) > 0 {
		trusted := sv.cfg.trusted(ctx)
		parsed, err := header.ParseValues(vs)
		if refusal := sv.malformed(ctx, err, trusted); refusal != nil {
			return nil, refusal
		}
		in.foreign = !trusted || err != nil
		switch {
		case err != nil: // counted and ignored
			in.unhonored = true
		case trusted:
			h, honored = parsed, true
		default:
			// A tollgate caller this server does not trust: none of the
			// units it lent are used here, so it is told so (spent 0), or
			// its lenient ledger would hold them with no record to
			// reconcile them.
			in.unhonored = true
		}
	}
	// The request's own deadline, not the admission tap's bound: the
	// server's cap is decided here, from this arrival (capped).
	ctxDeadline, hasDeadline := requestDeadline(ctx)
	latest := now.Add(sv.cfg.maxAttemptTime)
	st := &in.st
	if honored {
		st.ID, st.Call, st.Try = h.Attempt, h.Call, h.Try
		st.Deadline = latest
		d, ok := h.DeadlineTime()
		in.peerDeadline = ok
		if !ok && hasDeadline {
			// A header without d (it is optional on the wire): the
			// request's own deadline bounds the attempt, as for one minted
			// here; no layer extends it (DESIGN.md §3.1).
			d, ok = ctxDeadline, true
		}
		if ok && d.Before(latest) {
			st.Deadline = d
		} else {
			in.capped = true
			if ok {
				in.own = d
			}
		}
		st.Tenant = h.Tenant
		if st.Tenant == "" {
			st.Tenant = sv.tenantOf(ctx)
		}
		st.ledgerStore.Init(min(h.Units, sv.cfg.maxAllowance))
		in.strict, in.honored = h.Strict, true
	} else {
		st.ID, st.Call, st.Try, st.Origin = newAttemptID(now), header.DefaultCall, 1, true
		st.Deadline = latest
		if hasDeadline && ctxDeadline.Before(latest) {
			st.Deadline = ctxDeadline
		} else {
			in.capped = true
			if hasDeadline {
				in.own = ctxDeadline
			}
		}
		st.Tenant = sv.tenantOf(ctx)
		st.ledgerStore.Init(sv.cfg.defaultAllowance, budget.AtOrigin())
	}
	st.ledger = &st.ledgerStore
	in.until = st.Deadline.Add(sv.cfg.skew)
	// carried is the earliest deadline the request carried (zero: none):
	// the attempt's plus the skew unless that is the server's cap, then
	// the caller's own (in.own) plus the skew; and its own deadline
	// (requestDeadline).
	var carried time.Time
	switch {
	case !in.capped:
		carried = in.until
	case !in.own.IsZero():
		carried = in.own.Add(sv.cfg.skew)
	}
	if hasDeadline && (carried.IsZero() || ctxDeadline.Before(carried)) {
		carried = ctxDeadline
	}
	if dl, ok := ctx.Deadline(); ok && dl.Before(in.until) {
		in.until = dl // the request's own, or the tap's bound: the context's
	}
	// The handler's deadline is the server's own limit when it comes before
	// every deadline the request carried: this server's maximum from now
	// (capped), or the admission tap's, which bounded the context by the
	// maximum from the tap's now, earlier still when the interceptor runs
	// later (an outer interceptor took its time).
	in.serverLimit = carried.IsZero() || in.until.Before(carried)
	if !now.Before(st.Deadline.Add(sv.cfg.skew)) {
		if !sv.recorded(in) || st.Origin {
			// No record can answer it: the call keeps none, or its attempt
			// was minted here, now (its request's own deadline passed
			// before it got here), and no try of it ran anywhere. Looking
			// one up would only load the store and the control class.
			in.s = st
			return in, sv.expired(ctx, st) // in: the answer still carries tollgate-spent for r=1
		}
		// A finished record answers every later try, even a late one
		// (DESIGN.md §3.7): the store decides, and refuses the late try
		// itself when it holds no finished record.
		in.expired = true
	}
	st.runStore.Init(st.Call, st.Try)
	st.run = &st.runStore
	st.idempotent = in.info.Level == methodinfo.Idempotent
	in.s = st
	return in, nil
}

// malformed counts a tollgate header that does not parse (err) in
// tollgate.metadata.malformed, and returns the refusal of a trusted peer's
// (MALFORMED_HEADER, final; DESIGN.md §2.1); an untrusted peer's is only
// counted, and ignored. It returns nil when err is nil.
func (sv *server) malformed(ctx context.Context, err error, trusted bool) error {
	switch {
	case err == nil:
		return nil
	case trusted:
		sv.tel.malformed.Add(ctx, 1, malformedTrusted)
		return status.NotAdmitted(status.ReasonMalformedHeader, status.WithMessage(err.Error()))
	}
	sv.tel.malformed.Add(ctx, 1, malformedUntrusted)
	return nil
}

// tenantOf names the caller's tenant with WithTenant's function, as a token
// the header and record keys can carry (see tenantToken).
func (sv *server) tenantOf(ctx context.Context) string {
	return tenantToken(sv.cfg.tenant(ctx))
}

// tenantToken returns t when it is a valid tenant token, and otherwise "h."
// and its digest (see tenant.Token, which idempotency's AttemptService
// applies to its own WithTenant's names too).
func tenantToken(t string) string { return tenant.Token(t) }

// expired is the refusal of a try that came after its attempt's deadline,
// counted in tollgate.deadline.misses{stage=arrival}.
func (sv *server) expired(ctx context.Context, s *attemptState) error {
	sv.tel.late.Add(ctx, 1, arrivalStage)
	return status.NotAdmitted(status.ReasonDeadlineExpired, status.Fields{
		AttemptID: s.ID, Call: s.Call, Try: s.Try, Final: true,
		Message: "interceptor: the attempt's deadline has passed",
	})
}

// lateRefusal is expired's refusal of a try that came after its attempt's
// deadline plus the skew (s.Deadline), made not final by tryDeadlineOnly
// when that deadline is only the server's maximum counted from this
// request's arrival (inbound.capped), which a repeat gets afresh: a
// stream's request received after it passed, or a try a store found late.
func (sv *server) lateRefusal(ctx context.Context, in *inbound) error {
	s := in.s
	in.missCounted = true
	return status.With(sv.tryDeadlineOnly(sv.expired(ctx, s), in, s.Deadline.Add(sv.cfg.skew)), status.WithAttempt(s.ID, s.Call, s.Try))
}

// noRequest counts in tollgate.deadline.misses{stage=arrival} a stream
// received first (stream) whose request had not come when its context
// (the stream's, or receiveFirst's bound on it) ended, if a deadline
// ended it: the context's own (its error or cause is
// context.DeadlineExceeded, or it was canceled once its deadline had
// passed, as a client's RST_STREAM at its deadline can come before the
// server's timer), or the attempt's deadline plus the skew, which had
// passed by then; as contextEnded decides. The try came in time, but its
// request did not: it is counted as a request received after the
// attempt's deadline is (lateRefusal), before admission, so it holds no
// permit and no other stage counts it. A stream whose context is live (its
// client half-closed without a request) or was canceled before any
// deadline missed none.
func (sv *server) noRequest(ctx context.Context, in *inbound) {
	if ctx.Err() == nil {
		return
	}
	dl, hasDeadline := ctx.Deadline()
	byOwn := errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(context.Cause(ctx), context.DeadlineExceeded) ||
		(hasDeadline && !time.Now().Before(dl))
	if byOwn || !sv.cfg.now().Before(in.s.Deadline.Add(sv.cfg.skew)) {
		sv.tel.late.Add(ctx, 1, arrivalStage)
		in.missCounted = true
	}
}

// receiveFirst receives a server-streaming call's one request into m
// (stream), waiting for it no longer than its handler would run: until
// in.until, the attempt's deadline plus the skew (the server's maximum
// from this request's arrival when the caller set none), or the request's
// own deadline if earlier. A try that came after its attempt's deadline
// (in.expired), which only its record may answer, is waited for no longer
// than streamFinishTimeout. The stream's own context bounds grpc-go's
// RecvMsg, which nothing else can cancel, when it is the one the transport
// set its reader up on and tollgate's admission tap bounded, which is the
// same deadline (bounded, recvWatches). Otherwise (no such bound: a
// grpc-timeout came first, or no tap; or a context a stats handler's TagRPC
// or an interceptor chained outside tollgate's gave the RPC, with a timeout
// of its own or a cancellation when the server drains, which RecvMsg does
// not watch), the receive runs on a goroutine of its own and the wait ends
// at the bound, or when that context ends; the interceptor then returns,
// grpc-go ends the stream with its answer, and the receive, failed by that
// end, returns, and the goroutine with it: grpc-go's transport cancels the
// stream's context when it writes the status, which ends a blocked
// RecvMsg, whose own status then finds the stream done and sends nothing
// (checked on grpc-go v1.85). A wait the bound ended is answered by
// unreceived; one the outer context ended is refused as a try whose
// context ended before its record was begun (endedRefusal: nothing was
// begun or run) and counted as a receive that context ended would be;
// without the tap's bound, a cancellation of the transport stream's
// context, which may be its client's going away (untold), waits for the
// receive until the bound. A failed receive is counted by noRequest, with
// the stream's context.
func (sv *server) receiveFirst(ctx context.Context, ss grpc.ServerStream, in *inbound, m proto.Message, recorded bool) error {
	until := in.until
	if in.expired {
		until = time.Now().Add(streamFinishTimeout)
	}
	dl, ok := ctx.Deadline()
	ownBound := ok && !dl.After(until) // the context's own deadline ends the wait
	watched := recvWatches(ctx)
	if ownBound && watched {
		err := ss.RecvMsg(m)
		if err != nil {
			sv.noRequest(ctx, in)
		}
		return err
	}
	bctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	got := make(chan receipt, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				// A receive of a stream wrapped outside tollgate's
				// panicked: the panic goes on on the handler's goroutine,
				// as it would have without the bound, if that still waits.
				got <- receipt{panicked: true, panic: r}
			}
		}()
		got <- receipt{err: ss.RecvMsg(m)}
	}()
	var r receipt
	select {
	case r = <-got:
	case <-bctx.Done():
		select {
		case r = <-got: // it came as the wait ended
		default:
			switch {
			case ctx.Err() == nil && !ownBound:
				return sv.unreceived(bctx, in, recorded)
			case !watched && !readerEnded(ctx) && !untold(ctx):
				// A deadline RecvMsg may not watch (a grpc-timeout, a stats
				// handler's or an outer interceptor's, which is bctx's,
				// ends it now), or a cancellation it may not watch (a
				// stats handler's or an outer interceptor's), ended the
				// wait. Nothing was begun or run: the try is refused as
				// one whose context ended before its record was begun
				// (contextEnded), counted as a receive it ended would be.
				// The end of the context the transport's reader watches,
				// which shows where tollgate's tap bounded it
				// (readerEnded: the tap's bound passed, or its client went
				// away), ends the receive at once, which answers as it
				// would on the handler's goroutine.
				//
				// A deadline that ended it may be the request's own
				// grpc-timeout, which the transport's reader watches too:
				// the receive then ends within moments, failed by that
				// deadline. It is given receiveGrace to, so that the answer
				// (grpc-go's DEADLINE_EXCEEDED) does not depend on which of
				// the two timers fired first.
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					if late, ok := receiptWithin(got, receiveGrace); ok {
						r = late
						break
					}
				}
				return sv.receiveEnded(bctx, in)
			case !watched && !readerEnded(ctx):
				// Without the tap's bound, a cancellation of the transport
				// stream's context (untold) is its client's going away,
				// which ends the receive at once, or one a stats handler's
				// TagRPC context, which replaced it, made, which the
				// receive does not watch: the receive is waited for no
				// longer than the bound.
				t := time.NewTimer(time.Until(until))
				defer t.Stop()
				select {
				case r = <-got:
				case <-t.C:
					return sv.receiveEnded(bctx, in)
				}
			default:
				r = <-got // the stream's own context ended: its receive returns at once
			}
		}
	}
	if r.panicked {
		panic(r.panic)
	}
	if r.err != nil {
		sv.noRequest(ctx, in)
	}
	return r.err
}

// receiveGrace is how long receiveFirst waits, once a deadline ended its
// wait, for a receive that the same deadline may end (see receiveFirst).
const receiveGrace = 50 * time.Millisecond

// receiptWithin returns the receive's result if it comes within d.
func receiptWithin(got <-chan receipt, d time.Duration) (receipt, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-got:
		return r, true
	case <-t.C:
		return receipt{}, false
	}
}

// receiveEnded refuses a try whose wait for its request (receiveFirst) a
// context grpc-go's receive does not watch ended (bctx, ended): nothing was
// begun or run, and it is counted as a receive that context ended would be.
func (sv *server) receiveEnded(bctx context.Context, in *inbound) error {
	sv.noRequest(bctx, in)
	_, err := sv.endedRefusal(bctx, in, false)
	return err
}

// untold reports whether ctx, canceled without the admission tap's bound,
// ends as the transport stream's Context() does: its client went away,
// which ends grpc-go's receive at once, or a stats handler's TagRPC
// context, which grpc-go gives the stream in its place (see recvWatches),
// was canceled, which the receive does not watch; nothing tells which.
func untold(ctx context.Context) bool {
	if _, tapped := ctx.Value(tapBoundKey{}).(*tapBound); tapped || !errors.Is(ctx.Err(), context.Canceled) {
		return false
	}
	ts, ok := grpc.ServerTransportStreamFromContext(ctx).(interface{ Context() context.Context })
	return ok && ts.Context().Done() == ctx.Done()
}

// recvWatches reports whether grpc-go's RecvMsg on the stream of ctx, the
// context the stream interceptor was given, ends when ctx ends: only when
// ctx ends as the context tollgate's admission tap returned for the request
// (tapBound) does, which grpc-go's transport set its reader up on (the
// request's values added to it, as grpc-go's own are, change nothing). The
// transport stream's Context() is no evidence: grpc-go v1.85 replaces it
// (SetContext) with the context its stats handler's TagRPC returned, after
// the reader was set up, so a TagRPC that gives the RPC a deadline or a
// cancellation of its own would look watched. Nor is a context an
// interceptor chained outside tollgate's gave the stream, or a tap the user
// composed outside tollgate's, watched. Without that evidence (no bound
// from tollgate's tap: none installed, or the request's own deadline came
// first) it reports false: the wait then runs on a goroutine, which costs
// more but ends with ctx.
func recvWatches(ctx context.Context) bool {
	b, ok := ctx.Value(tapBoundKey{}).(*tapBound)
	return ok && b.Done() == ctx.Done()
}

// readerEnded reports whether the context grpc-go's transport set its
// reader up on has ended, or its deadline has passed (its timer ends it
// at once), so that a receive on it returns at once: the context
// tollgate's admission tap returned for the request (tapBound), which the
// reader watches, or which the context a tap composed around tollgate's
// returned derives from. The transport stream's Context() is no evidence
// (see recvWatches): a stats handler's TagRPC context, canceled, would pass
// for it while the reader waits on; nor is the context's error, which is
// the bound's too when the bound ended a context a stats handler derived
// from it. Without the tap's bound it reports false.
func readerEnded(ctx context.Context) bool {
	b, ok := ctx.Value(tapBoundKey{}).(*tapBound)
	return ok && (b.Err() != nil || !time.Now().Before(b.limit))
}

// receipt is what a receive receiveFirst runs on a goroutine returned.
type receipt struct {
	err      error
	panicked bool
	panic    any
}

// unreceived answers a stream received first whose request had not come
// when receiveFirst's bound (bctx, ended) ended the wait, and counts it
// once in tollgate.deadline.misses{stage=arrival}, as a request received
// after that deadline is: with the refusal such a request gets
// (lateRefusal: DEADLINE_EXPIRED, not final when only the server's cap
// from this arrival passed, with the tollgate-spent a strict caller needs)
// when no record could answer it (the call keeps none, or its attempt was
// minted here) or the refusal is not final (a repeat is answered by the
// record); otherwise, as a stream a grpc-timeout ended is, DEADLINE_EXCEEDED
// without a tollgate detail: only the call's record could answer a try of a
// caller's attempt that comes late (DESIGN.md §3.7), and without its
// request there is nothing to look it up with, so a tollgate client reads
// the answer as UNKNOWN and resolves it from the record.
func (sv *server) unreceived(bctx context.Context, in *inbound, recorded bool) error {
	if !in.expired {
		err := sv.lateRefusal(bctx, in)
		if !recorded || in.s.Origin || !status.OutcomeOf(err).Final() {
			return err
		}
	} else {
		sv.noRequest(bctx, in)
	}
	return grpcstatus.FromContextError(bctx.Err()).Err()
}

// admit asks the admission controller, if any, for a permit, and records
// the decision as a tollgate.admission event on the request's span (when a
// server span is recording, e.g. with otelgrpc): decision, class, and the
// requests queued ahead of this one in its class, as the controller counted
// them under its lock when it decided (admission.Decision), so the event
// costs no snapshot and no second look at the queue.
//
// in is the data path's request; a control-path call (in nil) is admitted
// under the tenant control resolved and the deadline of its context, which
// is the one its handler runs until. A late try (in.expired) only reads its
// call's record, as an AttemptService query does: it is admitted as one,
// in the control class (admission.Request.Control) under the attempt's
// tenant and its context's deadline, so that a flood of late tries loads
// the store no more than the control class lets queries (DESIGN.md §3.7,
// §3.12). Its request's size is not weighed: the lookup's work does not
// grow with it, and the control class's size bound is for queries.
func (sv *server) admit(ctx context.Context, method string, in *inbound, tenant string, req any, stream bool) (*admission.Permit, error) {
	ctrl := sv.cfg.admission
	if ctrl == nil {
		return nil, nil
	}
	size := -1
	if m, ok := req.(proto.Message); ok && (in == nil || !in.expired) {
		size = proto.Size(m)
	}
	deadline, startBy := time.Time{}, time.Time{}
	control := false
	switch {
	case in != nil && in.expired:
		tenant, control, stream = in.s.Tenant, true, false // a lookup, however long the stream would live
		deadline, _ = ctx.Deadline()
	case in != nil:
		tenant, deadline = in.s.Tenant, sv.runsUntil(in)
		if in.detached {
			startBy = in.until // the try waits in the queue on its client's context
		}
	default:
		deadline, _ = ctx.Deadline()
	}
	p, d, err := ctrl.AdmitDecision(ctx, admission.Request{Method: method, Tenant: tenant, Size: size, Deadline: deadline,
		StartBy: startBy, Stream: stream, Control: control})
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		decision := "admitted"
		switch {
		case err == nil:
		case errors.Is(err, context.Canceled) && status.OutcomeOf(err).Reason == status.ReasonUnspecified:
			// Its client went away before it started: nothing refused it
			// (admission counts it as cancelled). A context canceled once
			// its deadline had passed is admission's DEADLINE_EXPIRED.
			decision = "cancelled"
		default:
			decision = "refused:" + status.ReasonName(status.OutcomeOf(err).Reason)
		}
		span.AddEvent(eventAdmission, trace.WithAttributes(attrDecision.String(decision),
			attrEventClass.String(d.Class), attrQueuedAhead.Int64(int64(d.QueuedAhead))))
	}
	if err != nil {
		if in != nil {
			err = sv.tryDeadlineOnly(err, in, deadline)
			err = status.With(err, status.WithAttempt(in.s.ID, in.s.Call, in.s.Try))
		}
		return nil, err
	}
	return p, nil
}

// refused records a refusal err the interceptor made after admission,
// before the handler ran (the request could not be fingerprinted, or the
// store refused or failed to begin the try, or its record answered with a
// refusal: beginTry), in tollgate.server.refusals{reason} and as a
// tollgate.refusal event (reason) on the request's span when one records,
// after the tollgate.admission event that admitted it.
func (sv *server) refused(ctx context.Context, err error) {
	opt, name := refusalReason(status.OutcomeOf(err))
	sv.tel.refusals.Add(ctx, 1, opt)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(eventRefusal, trace.WithAttributes(attrEventReason.String(name)))
	}
}

// refusalReason is the reason attribute of a refusal with outcome o: its
// reason's name (UNSPECIFIED for one this build does not know, as
// status.ReasonName names it); without one, ABANDONED for an UNKNOWN (an
// earlier try's lease ran out) and CANCELLED for a NOT_ADMITTED (the try's
// context was canceled before its record was begun). The set is bounded by
// the Reason enum; its options are built once.
func refusalReason(o status.Outcome) (metric.AddOption, string) {
	i := int(o.Reason)
	switch {
	case i < 0 || i >= len(refusalOpts)-2:
		i = 0 // UNSPECIFIED
	case i == 0:
		i = len(refusalOpts) - 1 // CANCELLED
		if o.Kind == status.KindUnknown {
			i-- // ABANDONED
		}
	}
	return refusalOpts[i], refusalNames[i]
}

// refusalNames and refusalOpts are the reason attributes of
// tollgate.server.refusals: the Reason enum's names (UNSPECIFIED beyond
// those this version knows), then ABANDONED and CANCELLED.
var refusalNames, refusalOpts = func() ([]string, []metric.AddOption) {
	const reasons = 64
	names := make([]string, 0, reasons+2)
	for r := range status.Reason(reasons) {
		names = append(names, status.ReasonName(r))
	}
	names = append(names, "ABANDONED", "CANCELLED")
	opts := make([]metric.AddOption, len(names))
	for i, n := range names {
		opts[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", n)))
	}
	return names, opts
}()

// tryDeadlineOnly returns admission's refusal err (or contextEnded's,
// whose deadline is the ended context's, or lateRefusal's, whose deadline
// is the attempt's plus the skew), made not final when it
// is a final DEADLINE_EXPIRED (a waiter dropped because it can no longer
// finish by its deadline) that only the try's own deadline explains:
// admission is given the deadline the handler runs until (deadline), for a
// call whose handler keeps the client's cancellation the try's own, its
// grpc-timeout, which a client's per-try timeout may set well before the
// attempt's; while the attempt's deadline (with the skew) has not passed, a
// later try may fit. An attempt's deadline capped by the server's maximum
// from this request's arrival (inbound.capped) is the try's own too: a
// repeat arrives under a later cap, so the caller's own deadline (none, or
// inbound.own) decides.
//
// When the attempt's deadline is the caller's header's d (peerDeadline),
// the try's deadline is told from it by d plus the skew, not d alone: d is
// set on the caller's clock, which may differ from this server's by up to
// the skew, so a try's deadline that reads here between d and d + skew may
// be a per-try timeout set before d. (An attempt's deadline taken from the
// request's own deadline, minted here or under a header without d, is read
// on this server's clock, as the try's is: they are compared as they are.) Of the two mistakes the clocks
// allow, the one made is the harmless one: a caller's last try may be
// refused not final, and its repeat is refused at once (or never sent, its
// own deadline having passed), where a final refusal of a per-try timeout
// would stop a call a repeat could still finish. It is final when the
// try's deadline is at or past d + skew, or once d + skew has passed.
func (sv *server) tryDeadlineOnly(err error, in *inbound, deadline time.Time) error {
	o := status.OutcomeOf(err)
	if o.Reason != status.ReasonDeadlineExpired || !o.Final() {
		return err
	}
	attempt := in.s.Deadline
	if in.capped {
		attempt = in.own
	}
	margin := time.Duration(0) // the try's deadline and the attempt's are read on one clock
	if in.peerDeadline {
		margin = sv.cfg.skew
	}
	if !attempt.IsZero() && (!deadline.Before(attempt.Add(margin)) || !sv.cfg.now().Before(attempt.Add(sv.cfg.skew))) {
		return err // not final only when the try's own deadline, before the attempt's, was lost
	}
	// Admission's final refusal suggests no delay (its request's deadline
	// can wait for nothing); repeatable, it gets one that reflects the
	// class's queue, as every repeatable refusal carries (DESIGN.md §3.6).
	class := o.Detail.GetWorkloadClass()
	ra, ok := status.RetryAfter(err)
	if !ok {
		ra = sv.queueDelay(class)
	}
	return status.NotAdmitted(status.ReasonDeadlineExpired, status.Fields{
		RetryAfter: ra,
		Message:    "interceptor: the try cannot finish by its own deadline; the attempt's has not passed",
	}, status.WithClass(class), status.WithDetailsOf(err))
}

// queueDelay suggests a delay before a repeat into class, as admission's
// own refusals do (admission.Controller.RetryAfter): the class's predicted
// wait, or its learned service time when a request would start at once, jittered and below
// admission's bound (admission.WithMaxRetryAfter). Without admission there
// is no queue to reflect: none (the caller's backoff decides).
func (sv *server) queueDelay(class string) time.Duration {
	if sv.cfg.admission == nil {
		return 0
	}
	return sv.cfg.admission.RetryAfter(class)
}

// handlerContext returns the context the handler runs on: the attempt's
// deadline (plus skew) and the attempt state with its ledger.
func (sv *server) handlerContext(ctx context.Context, in *inbound) (context.Context, context.CancelFunc) {
	if in.foreign {
		ctx = withoutHeader(ctx)
	}
	cancel := context.CancelFunc(func() {})
	if d, ok := ctx.Deadline(); !ok || in.until.Before(d) {
		ctx, cancel = context.WithDeadline(ctx, in.until)
	}
	in.hctx = handlerCtx{Context: ctx, s: in.s}
	return &in.hctx, cancel
}

// withoutHeader returns ctx with the tollgate header taken out of its
// incoming metadata: a header this server did not honour (an untrusted
// peer's, or one ignored as malformed) must not reach a handler that
// forwards its incoming metadata upstream, to a server that trusts this
// one (DESIGN.md §3.2, §3.11: untrusted peers' headers are replaced at the
// edge), where it would name another tenant's attempt.
func withoutHeader(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx) // a copy
	delete(md, headerKey)
	return metadata.NewIncomingContext(ctx, md)
}

// handlerCtx is a handler's context: its parent with the attempt state and
// the state's ledger (budget.FromContext), carried without allocations of
// their own since it lives in the inbound. It is written once, before the
// handler runs, and only read after.
type handlerCtx struct {
	context.Context
	s *attemptState
}

func (c *handlerCtx) Value(key any) any {
	switch key.(type) {
	case attemptKey:
		return c.s
	case ctxkey.Allowance:
		return c.s.ledger
	}
	return c.Context.Value(key)
}

// answer turns the handler's error into the answer this server sends for
// the call it served (DESIGN.md §3.6): a refusal from below stays NOT_ADMITTED
// only for a method without side effects or when the handler declared it
// with status.WithoutEffect, and is re-addressed to this call (a deadline
// refusal judged by this server's cap, not final unless the caller's own
// deadline has passed); any other
// tollgate outcome from below, and any error that is not definite, is
// UNKNOWN; definite errors pass with their message and details bounded
// (status.Bounded).
func (sv *server) answer(in *inbound, err error) error {
	if err == nil {
		return nil
	}
	o := status.HandlerOutcome(err, in.info.Level == methodinfo.NoSideEffects)
	s := in.s
	switch o.Kind {
	case status.KindNotAdmitted:
		// ALLOWANCE_EXHAUSTED is final only at the origin (DESIGN.md §3.3),
		// and this server is never its caller's: it is below the caller's
		// origin, or it minted an attempt of its own for an untrusted
		// caller, whose repeat is minted anew with a fresh allowance.
		final := o.Final() && o.Reason != status.ReasonAllowanceExhausted
		if final && in.capped && (o.Reason == status.ReasonDeadlineExpired || o.Reason == status.ReasonDeadlineUnreachable) &&
			(in.own.IsZero() || sv.cfg.now().Before(in.own.Add(sv.cfg.skew))) {
			// Below, the attempt's deadline was this server's cap, counted
			// from this request's arrival (inbound.capped), which a repeat
			// gets afresh: only the caller's own deadline, once passed,
			// makes a deadline refusal final (tryDeadlineOnly).
			final = false
		}
		ra := refusalDelay(err, o, final)
		// The refusal keeps what it said, and the class that refused it.
		return status.NotAdmitted(o.Reason, status.Fields{
			AttemptID: s.ID, Call: s.Call, Try: s.Try, RetryAfter: ra, Final: final,
			Class: o.Detail.GetWorkloadClass(), Message: refusalMessage(err, o.Reason),
		}, status.WithUnitsRemaining(s.ledger.Free()), status.WithDetailsOf(err))
	case status.KindUnknown, status.KindCommitted:
		return status.OutcomeUnknown(err, status.WithAttempt(s.ID, s.Call, s.Try))
	default:
		// A definite error, bounded as tollgate's own outcomes are
		// (status.Bounded): the same answer goes to the caller and into
		// the call's record, whose query answer must fit what an owner
		// receives, and a caller with an 8 KiB header list limit must not
		// lose it to a transport INTERNAL.
		return status.Bounded(err)
	}
}

// trailer returns the trailer pairs of the answer err: tollgate-spent when
// the ledger spent units, when the caller asked for strict accounting, and
// when a trusted tollgate caller gets an UNKNOWN answer (unsettled), spent
// or not; "0" always to a caller whose header was not honoured; and the
// pushback hint of a NOT_ADMITTED answer.
//
// A lenient caller refunds a grant on an answer without tollgate-spent only
// when the answer proves that nothing below spent it (OK, a definite error,
// a refusal naming the try: §2.3); after any other it holds the grant until
// a record reconciles it, which a callee without records never does. So an
// UNKNOWN answer, which proves nothing, carries the trailer, the true value,
// often 0, whatever its code. Other answers do not when nothing was spent:
// OK answers and definite errors are ordinary results (NOT_FOUND…) that
// every caller settles by their code alone, and the trailer would cost each
// one about 16 allocations for nothing; this server's refusals name the
// try, which settles them. And a refusal must not carry a 0 the caller did
// not ask for: a server that does not speak tollgate, whose handler ran and
// called down through a tollgate client, may relay a refusal of that call
// with its trailers, and its caller reads such a refusal (naming another
// attempt) as UNKNOWN only when it came without tollgate-spent
// (owner.relayed), as a tollgate server's own refusal under an attempt it
// minted comes with 0.
func (sv *server) trailer(in *inbound, spent int64, err error) metadata.MD {
	var md metadata.MD
	switch {
	case in != nil && in.unhonored:
		md = metadata.MD{spentTrailerKey: []string{"0"}} // of the caller's grant
	case in != nil && (spent > 0 || in.strict || in.honored && unsettled(err)):
		in.spentValue[0] = strconv.FormatInt(spent, 10)
		md = metadata.MD{spentTrailerKey: in.spentValue[:]}
	}
	if v, ok := status.Pushback(err); ok {
		if md == nil {
			md = metadata.MD{}
		}
		md[status.PushbackKey] = []string{v}
	}
	return md
}

// unsettled reports whether err, an answer this server sends, is UNKNOWN:
// it proves nothing to a lenient caller of what was spent below (DESIGN.md
// §2.3), whatever its code. An UNKNOWN keeps its cause's code, which may be
// a definite one (an IDEMPOTENT handler's call refused CALL_KEY_REQUIRED,
// INVALID_ARGUMENT, and passed up; a handler's own OutcomeUnknown of a
// FAILED_PRECONDITION): the caller reads its detail, not its code, and
// would hold the grant. It is never read on success.
func unsettled(err error) bool {
	return err != nil && status.OutcomeOf(err).Kind == status.KindUnknown
}

// run calls handler, recovering a panic into an UNKNOWN outcome when the
// server opted in.
func (sv *server) run(f func() error) (err error) {
	if sv.cfg.recoverPanics {
		defer func() {
			if r := recover(); r != nil {
				err = status.OutcomeUnknown(fmt.Errorf("interceptor: handler panic: %v", r), status.WithCode(codes.Internal))
			}
		}()
	}
	return f()
}

// passPanic, deferred before a handler runs, acts when the handler panicked
// and the panic goes on up (the server did not opt into WithRecovery; a
// recovery interceptor chained outside this one may answer it — grpc-go
// recovers none, and without one the process exits): *ran is
// still false. The panic is not recovered, but the call's bookkeeping ends
// as for a recovered one: the ledger is sealed, so the handler's goroutines
// spend nothing more; tollgate-spent is set (on ss for a stream, ctx's
// transport for a unary call), so that a strict caller, or one whose grant
// was used, learns what was spent; and a recorded call's record is
// finished UNKNOWN (DESIGN.md §3.7), rather than read IN_PROGRESS until its
// lease ends, which would keep the owner polling. The handler's admission
// permit is given back first, as after any handler's end. A failure or
// panic of the store here is dropped: the handler's panic is the one that
// goes on.
func (sv *server) passPanic(ran *bool, ctx context.Context, ss grpc.ServerStream, method string, in *inbound, fp idempotency.Digest, recorded bool, permit *admission.Permit) {
	if *ran {
		return
	}
	permit.Abandon() // the handler ended: its slot is not held while the record is finished
	spent := in.s.ledger.Seal()
	answer := status.OutcomeUnknown(errors.New("interceptor: the handler panicked"), status.WithCode(codes.Internal))
	if ss != nil {
		sv.setStreamTrailer(ss, in, spent, answer)
	} else {
		sv.setTrailer(ctx, in, spent, answer)
	}
	if !recorded {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			logger.Errorf("interceptor: a panic while recording a handler's panic: %v", r)
		}
	}()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), streamFinishTimeout)
	defer cancel()
	_ = sv.finishTry(fctx, method, in, fp, nil, answer, spent, ss != nil)
}

// unary is the unary server interceptor.
func (sv *server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if isControl(info.FullMethod) {
		return sv.control(ctx, info.FullMethod, req, func(ctx context.Context) (any, error) { return handler(ctx, req) })
	}
	in, err := sv.begin(ctx, info.FullMethod)
	if err != nil {
		sv.setTrailer(ctx, in, 0, err)
		return nil, err
	}
	recorded := sv.recorded(in)
	in.detached = recorded
	permit, err := sv.admit(ctx, info.FullMethod, in, "", req, false)
	if err != nil {
		sv.setTrailer(ctx, in, 0, err)
		return nil, err
	}
	// A permit whose handler never ran (a record answered, the store
	// refused, a panic went up) is abandoned: its time is not a service time
	// and must not teach admission's estimate. Release, below, wins when the
	// handler ran, as endLookup's release does for a late try's lookup, which
	// was its work.
	defer permit.Abandon()

	var fp idempotency.Digest
	hctx, cancel := sv.handlerContext(ctx, in)
	defer cancel()
	if recorded {
		if fp, err = in.fingerprint(info.FullMethod, req); err != nil {
			sv.refused(ctx, err)
			sv.setTrailer(ctx, in, 0, err)
			return nil, err
		}
		started, resp, err := sv.beginTry(ctx, info.FullMethod, in, fp, false)
		if in.expired {
			sv.endLookup(ctx, in, permit)
		}
		if !started {
			sv.setTrailer(ctx, in, 0, err)
			return resp, err
		}
		dctx, dcancel := sv.detach(hctx, in)
		defer dcancel()
		hctx = dctx
	}
	var resp any
	ran := false
	defer sv.passPanic(&ran, ctx, nil, info.FullMethod, in, fp, recorded, permit)
	herr := sv.run(func() (err error) {
		resp, err = handler(hctx, req)
		return err
	})
	ran = true
	permit.Release()
	spent := in.s.ledger.Seal()
	answer := sv.answer(in, herr)
	if recorded {
		answer = sv.finishTry(hctx, info.FullMethod, in, fp, resp, answer, spent, false)
	}
	sv.setTrailer(ctx, in, spent, answer)
	if answer != nil {
		return nil, answer
	}
	return resp, nil
}

// endLookup ends the lookup permit of a late try (inbound.expired) once the
// store has answered it. The lookup was its work, as a query's is, so its
// time teaches admission's service estimate, and one its record answered
// after its context ended ran late: admission counts it as a run miss
// (Release). A try the interceptor has counted in tollgate.deadline.misses
// (missCounted: refused for its lateness, lateRefusal, or for its context's
// end, contextEnded) is counted nowhere again: while its context lives its
// permit is released without a run miss (ReleaseMissCounted), since its
// deadline may pass between this look and the release; once its context
// has ended it is left to the caller's deferred Abandon, as no service time.
func (sv *server) endLookup(ctx context.Context, in *inbound, permit *admission.Permit) {
	switch {
	case !in.missCounted:
		permit.Release()
	case ctx.Err() == nil:
		permit.ReleaseMissCounted()
	}
}

// setTrailer sets the call's trailer (see trailer), when it has anything to
// say, on the transport stream of a unary call's ctx.
func (sv *server) setTrailer(ctx context.Context, in *inbound, spent int64, err error) {
	if md := sv.trailer(in, spent, err); md != nil {
		_ = grpc.SetTrailer(ctx, md)
	}
}

// fenceShortcut answers a ballot the AttemptService must not: a malformed
// one (INVALID_ARGUMENT, as the service would), an untrusted peer's, and one
// of a method this server declares NO_SIDE_EFFECTS. An untrusted peer's
// tries are re-minted here under attempt IDs it never sees, so its ballot
// can never stop one of them; a NO_SIDE_EFFECTS method's tries keep no
// records and run whatever the store holds (DESIGN.md §3.7), so a tombstone
// would promise what no try heeds, with units_spent 0 for tries that may
// have spent units below. Either way the honest answer is UNKNOWN, and
// nothing is fenced. It returns nil, nil for a ballot the service answers.
func (sv *server) fenceShortcut(fence *tollgatev1.FenceAttemptRequest, tenant string, trusted bool) (*tollgatev1.AttemptRecord, error) {
	key := idempotency.Key{Tenant: tenant, AttemptID: fence.GetAttemptId(), Call: fence.GetCall(), Method: fence.GetMethod()}
	if err := idempotency.ValidateFence(key, fence.GetFenceThroughTry()); err != nil {
		return nil, grpcstatus.Error(codes.InvalidArgument, err.Error())
	}
	if !trusted || methodinfo.Of(fence.GetMethod()).Level == methodinfo.NoSideEffects {
		return &tollgatev1.AttemptRecord{AttemptId: fence.GetAttemptId(), Call: fence.GetCall(), Method: fence.GetMethod(),
			State: tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN}, nil
	}
	return nil, nil
}

// control runs a control-path call (AttemptService, health, reflection):
// no records, no ledger. An AttemptService query is admitted through the
// controller's control class under the caller's tenant (so that the
// class's tenant limits hold) and the deadline of its context (so that a
// query that cannot finish in time is refused, not queued); a refusal
// carries grpc-retry-pushback-ms, as on the data path. Health checks and
// control streams (req nil) take no admission slot (see below).
// FenceAttempt from an untrusted peer is answered UNKNOWN (see below).
// The caller's tenant (a trusted peer's header "n", else WithTenant's) is put
// in the context for idempotency.AttemptService, so that a query resolves
// the same tenant as the try it asks about. A trusted peer's malformed
// header is refused MALFORMED_HEADER, as on the data path; an untrusted
// peer's is counted and ignored.
func (sv *server) control(ctx context.Context, method string, req any, f func(context.Context) (any, error)) (any, error) {
	trusted := sv.cfg.trusted(ctx)
	tenant := ""
	if vs := metadata.ValueFromIncomingContext(ctx, headerKey); len(vs) > 0 {
		h, err := header.ParseValues(vs)
		// As on the data path: a trusted peer's malformed header is
		// refused, never read for its tenant.
		if refusal := sv.malformed(ctx, err, trusted); refusal != nil {
			return nil, refusal
		}
		if err == nil && trusted {
			tenant = h.Tenant
		} else {
			ctx = withoutHeader(ctx) // as on the data path (handlerContext)
		}
	}
	if tenant == "" {
		tenant = sv.tenantOf(ctx)
	}
	if sv.cfg.store == nil && req != nil && strings.HasPrefix(method, attemptServicePrefix) {
		// Its data path never begins a record, so the service, whatever
		// store it reads, would answer UNSEEN (nothing ran) for calls that
		// ran, and fence them (they never will): an owner would run them
		// again, an operator would think they never ran. A query that
		// reaches the stream interceptor (req nil: the generated service is
		// unary) is a transparent proxy's, forwarded to a server that
		// answers for itself.
		return nil, grpcstatus.Error(codes.Unimplemented,
			"interceptor: this server keeps no attempt records (no WithAttemptStore): it cannot say what ran")
	}
	if fence, ok := req.(*tollgatev1.FenceAttemptRequest); ok && method == fenceMethod {
		if rec, err := sv.fenceShortcut(fence, tenant, trusted); rec != nil || err != nil {
			return rec, err
		}
	}
	ctx = idempotency.ContextWithTenant(ctx, tenant)
	if req == nil || strings.HasPrefix(method, healthServicePrefix) {
		// A control stream (a health Watch, a reflection session) lives as
		// long as its client: it would hold one of the control class's few
		// slots for that long, and two of them would starve AttemptService
		// queries. Streams on the control path take no slot. Nor does a
		// health Check, answered from memory at once: behind AttemptService
		// queries waiting on a slow store it would be refused, and an
		// orchestrator would restart a server whose data path is healthy.
		return sv.runControl(ctx, f)
	}
	permit, err := sv.admit(ctx, method, nil, tenant, req, false)
	if err != nil {
		sv.setTrailer(ctx, nil, 0, err) // grpc-retry-pushback-ms, as on the data path
		return nil, err
	}
	defer permit.Release()
	return sv.runControl(ctx, f)
}

// runControl runs a control-path handler, recovering its panic (a third
// party's Store, say) as the data path does when the server opted in.
func (sv *server) runControl(ctx context.Context, f func(context.Context) (any, error)) (resp any, err error) {
	err = sv.run(func() (err error) {
		resp, err = f(ctx)
		return err
	})
	return resp, err
}

// streamFinishTimeout bounds a Finish the server makes on a context detached
// from the client's, whatever became of the client: a stream's record after
// its handler returned, a panicked handler's record (passPanic), and the
// tombstone of a late try a store started (beginTry).
const streamFinishTimeout = 5 * time.Second

// stream is the stream server interceptor. A stream holds its admission
// permit for its handler's lifetime (given back before its record is
// finished, as a unary call's is), and one whose handler ends after the
// deadline it was admitted under is counted by admission in
// tollgate.deadline.misses{stage=run}, as a unary call that finishes late is
// (Permit.EndStream; without admission neither is counted) — unless that
// deadline was the server's own maximum (WithMaxAttemptTime, from the
// request's arrival here or at the admission tap, whichever bounded its
// context: the request carried no deadline, or a later one), which ends a long-lived stream by
// the server's limit, not by a deadline the request missed
// (inbound.serverLimit: its permit is abandoned, judged against nothing);
// its ledger is sealed and tollgate-spent set when
// the handler returns. With a store, a stream keeps a record like a unary
// call, and a finished record answers a later try with COMMITTED or its
// error; its handler keeps the client's cancellation. Its try is begun
// before the handler chain runs — the handler and every interceptor chained
// inside this one run only for a try the store started, as for a unary
// call — and when the store answers instead, that answer is sent and nothing
// inner runs.
//
// A server-streaming call whose request type the protobuf registry knows
// (methodinfo.Info.Input), when it is recorded (a store, and a method not
// declared NO_SIDE_EFFECTS) or the server has admission, is received here
// first (unless WithoutStreamRequestFirst), before admission, as grpc-go
// decodes a unary request before any interceptor runs: a client that opens the stream and sends
// nothing holds no slot, and a request that comes after the attempt's
// deadline is refused (or, for a recorded call, only reads its record). Its
// one request is read from the client, fingerprinted with the method when
// recorded (so that its call key reused with another request is refused
// ATTEMPT_REQUEST_MISMATCH), and handed to the handler's first RecvMsg
// (preReceived). A first receive that fails (the client half-closed without
// a request, or went away) returns its error, as grpc-go's generated handler
// would, and nothing is begun or run; one that a deadline ended (the
// request had not come by it) is counted in
// tollgate.deadline.misses{stage=arrival} (noRequest). The wait for the
// request lasts no longer than the handler would run (receiveFirst): the
// attempt's deadline plus the skew (the server's maximum when the caller
// set none), or the request's own deadline if earlier; where neither the
// admission tap's bound nor a grpc-timeout ends it by then (no tap, and a
// client that sent no grpc-timeout or a later one), the interceptor ends
// it there, with the refusal a request coming after it would get when no
// record could answer that request, else DEADLINE_EXCEEDED, as a
// grpc-timeout would (unreceived), and its trailer.
// Other streams — client-streaming and
// bidi ones, whose requests arrive while their handler runs, and
// server-streaming ones of a method the registry does not know — are
// admitted before their handler and, when recorded, begun with a
// fingerprint of the method alone.
func (sv *server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	if isControl(info.FullMethod) {
		_, err := sv.control(ctx, info.FullMethod, nil, func(ctx context.Context) (any, error) {
			return nil, handler(srv, &serverStream{ServerStream: ss, ctx: ctx})
		})
		return err
	}
	in, err := sv.begin(ctx, info.FullMethod)
	if err != nil {
		sv.setStreamTrailer(ss, in, 0, err)
		return err
	}
	recorded := sv.recorded(in)
	// A server-streaming call's one request is received first when the
	// registry knows its type and there is something to guard, before
	// admission as a unary request is decoded before it: a client that opens
	// the stream and sends nothing holds no slot, the request's size counts
	// as a unary one's does, and a recorded call's fingerprint covers it.
	var (
		pre proto.Message // the request received first
		req any           // the same, or nil: admission and the fingerprint weigh no request
	)
	if input := in.info.Input; input != nil && info.IsServerStream && !info.IsClientStream &&
		sv.cfg.streamRequestFirst && (recorded || sv.cfg.admission != nil) {
		m := input.New().Interface()
		if err := sv.receiveFirst(ctx, ss, in, m, recorded); err != nil {
			// No request: grpc-go's generated handler would return this
			// error without calling the method. Nothing ran and nothing
			// is recorded. grpc-go has sent its own status already when
			// the error is its own, so the trailer goes only where a
			// wrapping stream failed the receive, or the handler's
			// deadline, or the context an interceptor chained outside
			// this one gave the stream, ended the wait (receiveFirst), and
			// grpc-go's RecvMsg has failed nothing yet. A try whose deadline
			// ended it while it waited missed that deadline before it
			// began, as one whose request came late did: receiveFirst
			// counts it on arrival (noRequest).
			sv.setStreamTrailer(ss, in, 0, err)
			return err
		}
		pre, req = m, m
		if !in.expired && !sv.cfg.now().Before(in.s.Deadline.Add(sv.cfg.skew)) {
			// The request came after the attempt's deadline: as for any
			// late try (begin), a recorded one of a caller's attempt is
			// answered by its record alone, and another is refused.
			if !recorded || in.s.Origin {
				err := sv.lateRefusal(ctx, in)
				sv.setStreamTrailer(ss, in, 0, err)
				return err
			}
			in.expired = true
		}
	}
	permit, err := sv.admit(ctx, info.FullMethod, in, "", req, true)
	if err != nil {
		sv.setStreamTrailer(ss, in, 0, err)
		return err
	}
	// A stream holds its slot for its lifetime, which is not a service time:
	// it gives the slot back without teaching admission's estimate. A
	// permit whose handler never ran is abandoned; one whose handler ran
	// is ended below (EndStream), as a unary call's is released.
	defer permit.Abandon()
	hctx, cancel := sv.handlerContext(ctx, in)
	defer cancel()
	hss := grpc.ServerStream(&serverStream{ServerStream: ss, ctx: hctx}) // the handler's stream
	if pre != nil {
		hss = &preReceived{serverStream: serverStream{ServerStream: ss, ctx: hctx}, req: pre}
	}
	var fp idempotency.Digest
	if recorded {
		if fp, err = in.fingerprint(info.FullMethod, req); err != nil {
			sv.refused(ctx, err)
			sv.setStreamTrailer(ss, in, 0, err)
			return err
		}
		started, _, err := sv.beginTry(ctx, info.FullMethod, in, fp, true)
		if in.expired {
			sv.endLookup(ctx, in, permit)
		}
		if !started {
			sv.setStreamTrailer(ss, in, 0, err)
			return err
		}
	}
	// Unlike a unary handler, a stream's handler keeps the client's
	// cancellation: it talks to the client, and a cancelled stream must not
	// hold its slot until the deadline. Its record is finished on a context
	// of its own, so it resolves all the same.
	ran := false
	defer sv.passPanic(&ran, ctx, ss, info.FullMethod, in, fp, recorded, permit)
	herr := sv.run(func() error { return handler(srv, hss) })
	ran = true
	// The slot was the handler's: it is given back before the record is
	// finished, as a unary call's is, so that a store slow to finish
	// records does not keep the class full of streams whose handlers have
	// ended. Its lifetime teaches admission nothing, but its deadline is
	// judged as a unary call's is when its permit is released: a handler
	// that ended after it (its context ran out while it ran) is a run miss
	// (EndStream), unless the try was counted already (missCounted) or
	// that deadline was the server's own maximum, which the request did not
	// carry (serverLimit: a long-lived stream the server ended by its limit).
	if in.missCounted || in.serverLimit {
		permit.Abandon()
	} else {
		permit.EndStream()
	}
	spent := in.s.ledger.Seal()
	answer := sv.answer(in, herr)
	if recorded {
		fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), streamFinishTimeout)
		answer = sv.finishTry(fctx, info.FullMethod, in, fp, nil, answer, spent, true)
		fcancel()
	}
	sv.setStreamTrailer(ss, in, spent, answer)
	return answer
}

func (sv *server) setStreamTrailer(ss grpc.ServerStream, in *inbound, spent int64, err error) {
	if md := sv.trailer(in, spent, err); md != nil {
		ss.SetTrailer(md)
	}
}

// serverStream gives the handler the attempt's context.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

// AdmissionTap returns the tap handle ServerOptions installs with an
// admission controller, for a server that installs a tap of its own
// (grpc-go allows one per server): it passes WithoutAdmissionTap to
// ServerOptions and calls this handle first from its own. Give it the
// options given to ServerOptions or NewServerInterceptors — the trusted
// peers, clock skew, maximum attempt time and attempt store it reads; it
// panics on an invalid option, as ServerOptions does, and on a nil ctrl. Called without
// options, as before they were taken, it cannot know the server's
// configuration: it trusts no peer and bounds no stream (see below). The
// trust function runs here too, on the connection's reader goroutine, for
// requests that carry a tollgate header: keep it cheap.
//
// The handle runs the controller's allocation-free check
// (Controller.TapHandle), before the request is read, and on refusal adds
// the attempt, call and try read from the request's tollgate header
// whenever it is well-formed, a trusted peer's or an untrusted one's (see
// below), so that the caller can tell the refusal answers the very try it
// sent and refund its grant; a refusal of a request without a well-formed
// header names no try.
//
// Given the server's options, it also bounds the stream's own context of a
// request it lets in, which grpc-go's RecvMsg waits on, by the time the
// request may live, as the handler's context is: the attempt's deadline (a
// trusted peer's, capped by the maximum attempt time from now, or that
// maximum) plus the skew, when the request carries no earlier grpc-timeout. The handler's context ends then already;
// without the bound, a client-streaming or bidi call whose client opened
// the stream and sent nothing would keep waiting in RecvMsg, holding its
// admission slot, for as long as the client kept the stream open. Control
// methods (AttemptService, health, reflection) are not bounded: a health
// Watch lives as long as its client.
//
// A trusted peer's request whose header says its attempt's deadline has
// passed is let through to the server's interceptor. With records, it
// answers a try late by more than the clock skew from its call's record
// (DESIGN.md §3.7: a finished record answers every later try), or refuses
// it DEADLINE_EXPIRED; refused here for its data class, such a try would
// read as a repeatable NOT_ADMITTED, even for a call whose record says it
// committed. Its lookup is admitted in the controller's control class, as
// a record query is, and refused as one is (a full class, a tenant over the
// class's limits). Without a store, it refuses such a try
// DEADLINE_EXPIRED, final, before admission, with the tollgate-spent a
// strict caller needs.
// These decisions, and a trusted peer's malformed header (counted in
// tollgate.metadata.malformed and refused MALFORMED_HEADER), come before
// the controller's, which counts only the refusals the handle sends. An
// untrusted peer's well-formed header grants nothing here, as in the
// interceptor, but a refusal names its try all the same, so that its owner
// refunds the units it lent (the handle sends no tollgate-spent); its
// malformed header is counted when the handle refuses the request, and
// otherwise by the interceptor.
func AdmissionTap(ctrl *admission.Controller, opts ...ServerOption) tap.ServerInHandle {
	if ctrl == nil {
		panic("interceptor: AdmissionTap: nil admission controller")
	}
	sv, err := newServer(opts)
	if err != nil {
		panic(err)
	}
	return sv.tapHandle(ctrl, len(opts) > 0)
}

// tapHandle is AdmissionTap for ctrl under sv's configuration; bound says
// whether it bounds streams (it knows the server's configuration).
func (sv *server) tapHandle(ctrl *admission.Controller, bound bool) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		var (
			h       header.Header
			parsed  bool  // h holds a well-formed header, trusted or not
			trusted bool  // the peer is trusted (when it sent a header)
			perr    error // the header's, when it does not parse
		)
		vs := info.Header.Get(headerKey)
		if len(vs) > 0 {
			trusted = sv.cfg.trusted(ctx)
			h, perr = header.ParseValues(vs)
			parsed = perr == nil
		}
		// What does not depend on admission is decided first, so that the
		// controller counts only the refusals this handle sends: a trusted
		// peer's malformed header is refused MALFORMED_HEADER, and a
		// trusted peer's data request past its attempt's deadline is let
		// through to the interceptor, which answers it from its record
		// (admitted in the control class, as a record query: its data
		// class's flag is not read) or refuses it DEADLINE_EXPIRED before
		// admission, with the tollgate-spent a strict caller needs (a tap
		// can send no trailer).
		if trusted && perr != nil {
			return ctx, sv.malformed(ctx, perr, true)
		}
		honored := trusted && parsed
		now := sv.cfg.now()
		var d time.Time
		if honored {
			d, _ = h.DeadlineTime()
		}
		if !d.IsZero() && !isControl(info.FullMethodName) && !now.Before(d) {
			return sv.bounded(ctx, info.FullMethodName, bound, now, d), nil
		}
		admitted, err := ctrl.TapHandle(ctx, info)
		if err == nil {
			return sv.bounded(admitted, info.FullMethodName, bound, now, d), nil
		}
		// Refused here, the request never reaches the interceptor, which
		// counts an untrusted peer's malformed header: count it.
		_ = sv.malformed(ctx, perr, trusted)
		if !parsed {
			return ctx, err
		}
		// The refusal names the try it answers, also an untrusted peer's
		// (whose grant is used for nothing here): nothing ran, and a
		// caller that sees its own try named refunds the units it lent,
		// as it would if the interceptor had answered tollgate-spent 0.
		return ctx, status.With(err, status.WithAttempt(h.Attempt, h.Call, h.Try))
	}
}

// bounded returns the context of a data request the tap lets in, bounded as
// the interceptor's handler deadline is when bound is set: the attempt's
// deadline d (zero: none) plus the skew, the attempt's deadline being the
// caller's (capped by the maximum) or the maximum from now. Only for a
// request the tap lets in: grpc-go drops the context of a refused one
// without cancelling its parent, which would keep the timer, and what the
// context holds, alive until the bound.
func (sv *server) bounded(ctx context.Context, method string, bound bool, now, d time.Time) context.Context {
	if !bound || isControl(method) {
		return ctx
	}
	limit := now.Add(sv.cfg.maxAttemptTime)
	if !d.IsZero() {
		limit = minTime(limit, d)
	}
	limit = limit.Add(sv.cfg.skew)
	if dl, ok := ctx.Deadline(); limit.After(now) && (!ok || limit.Before(dl)) {
		// cancel is not called: the bounded context is released with its
		// parent, the stream's context, which grpc-go cancels when the
		// stream ends.
		bctx, cancel := context.WithDeadline(ctx, limit)
		_ = cancel
		return &tapBound{Context: bctx, limit: limit, own: dl, hasOwn: ok}
	}
	return ctx
}

// tapBound is the context bounded sets on a request: the bound, and the
// request's own deadline (own; hasOwn false: it had none), which the bound
// hides from ctx.Deadline. The bound is the server's (its maximum attempt
// time from the tap's now, or the caller's d, plus the skew): the
// interceptor must not read it as the request's own deadline, by which it
// decides an attempt minted here, or a header's without d, and whether a
// refusal is final (requestDeadline).
type tapBound struct {
	context.Context
	limit  time.Time
	own    time.Time
	hasOwn bool
}

type tapBoundKey struct{}

func (b *tapBound) Value(key any) any {
	if key == (tapBoundKey{}) {
		return b
	}
	return b.Context.Value(key)
}

// requestDeadline returns the request's own deadline: ctx's, unless that is
// the tap's bound (bounded), which is the server's, not the request's; then
// the deadline the request had before the tap bounded it. A deadline that
// an interceptor chained outside tollgate's set before the bound is the
// request's own.
func requestDeadline(ctx context.Context) (time.Time, bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return dl, ok
	}
	if b, isBound := ctx.Value(tapBoundKey{}).(*tapBound); isBound && !dl.Before(b.limit) {
		return b.own, b.hasOwn
	}
	return dl, ok
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// NewServerOptions returns the grpc.ServerOptions that install tollgate on a
// server: the unary and stream interceptors (chained, so they compose with
// the server's own in the order given to grpc.NewServer), the admission
// controller's tap handle (WithAdmission, unless WithoutAdmissionTap),
// grpc.MaxRecvMsgSize, grpc.MaxHeaderListSize and grpc.MaxConcurrentStreams
// (which make admission's byte bounds real: generated handlers decode
// requests before interceptors run, and a request's metadata is bounded
// too; with admission, the stream bound exceeds what the controller holds
// at once, so that a full connection keeps a stream for the control path:
// see WithMaxConcurrentStreams). The returned options are built once and safe for concurrent use. An
// invalid option is an error wrapping ErrInvalidOption.
func NewServerOptions(opts ...ServerOption) ([]grpc.ServerOption, error) {
	sv, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	cfg := &sv.cfg
	out := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(sv.unary),
		grpc.ChainStreamInterceptor(sv.stream),
		grpc.MaxRecvMsgSize(cfg.maxRecvMsgSize),
		grpc.MaxHeaderListSize(cfg.maxHeaderListSize),
		grpc.MaxConcurrentStreams(cfg.maxStreams),
	}
	if cfg.admission != nil && cfg.admissionTap {
		out = append(out, grpc.InTapHandle(sv.tapHandle(cfg.admission, true)))
	}
	return out, nil
}

// ServerOptions is NewServerOptions for static configuration: it panics on
// an invalid option, as regexp.MustCompile does on a bad pattern.
func ServerOptions(opts ...ServerOption) []grpc.ServerOption {
	out, err := NewServerOptions(opts...)
	if err != nil {
		panic(err)
	}
	return out
}

// NewDialOptions returns the grpc.DialOptions that install tollgate on a
// client: the unary and stream interceptors, the stats handler that tells a
// try never sent from one that may have been, and grpc.WithDisableRetry, so
// that tollgate's interceptor is the one owner that repeats a call (grpc-go's
// transparent retry of streams the server never saw goes on). The returned
// options are safe for concurrent use. An invalid option is an error
// wrapping ErrInvalidOption.
func NewDialOptions(opts ...ClientOption) ([]grpc.DialOption, error) {
	c, err := newClient(opts, true)
	if err != nil {
		return nil, err
	}
	cfg := &c.cfg
	out := []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(c.unary),
		grpc.WithChainStreamInterceptor(c.stream),
		grpc.WithStatsHandler(statsHandler{}),
		grpc.WithDisableRetry(),
	}
	if cfg.serviceConfig != "" {
		if loops := secondRetryLoops(cfg.serviceConfig); len(loops) > 0 {
			logger.Warningf("interceptor: the service config's %s would repeat calls beside tollgate's owner; grpc-go's retry stays disabled and ignores it",
				strings.Join(loops, " and "))
		}
		out = append(out, grpc.WithDefaultServiceConfig(cfg.serviceConfig))
	}
	return out, nil
}

// secondRetryLoops names the retry mechanisms a service config declares.
func secondRetryLoops(serviceConfig string) []string {
	var loops []string
	for _, key := range []string{"retryPolicy", "hedgingPolicy"} {
		if strings.Contains(serviceConfig, `"`+key+`"`) {
			loops = append(loops, key)
		}
	}
	return loops
}

// DialOptions is NewDialOptions for static configuration: it panics on an
// invalid option.
func DialOptions(opts ...ClientOption) []grpc.DialOption {
	out, err := NewDialOptions(opts...)
	if err != nil {
		panic(err)
	}
	return out
}

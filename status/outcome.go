package status

import (
	"context"
	"errors"
	"time"

	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// Kind is what a caller may conclude about a call's effect. Its zero value is
// KindOK.
type Kind uint8

const (
	// KindOK means the call succeeded.
	KindOK Kind = iota
	// KindFailed means the call ended with a definite error (or a request
	// mismatch); repeating it cannot help.
	KindFailed
	// KindNotAdmitted means the call had no effect at the answering tier or
	// below; it may be repeated unless the outcome is final.
	KindNotAdmitted
	// KindUnknown means the call may or may not have had its effect; it must
	// not be repeated before its state is queried.
	KindUnknown
	// KindCommitted means the effect happened; the response is not available.
	KindCommitted
)

var kindNames = [...]string{"OK", "FAILED", "NOT_ADMITTED", "UNKNOWN", "COMMITTED"}

// String returns the kind's name, for example "NOT_ADMITTED", or "INVALID"
// for a value not declared here.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "INVALID"
}

// Outcome is the classification of an error, as [OutcomeOf],
// [OutcomeOfCall] and [HandlerOutcome] return it.
type Outcome struct {
	// Kind is what the caller may conclude about the effect.
	Kind Kind
	// Reason is the tollgate reason, when one is known; REASON_UNSPECIFIED
	// otherwise.
	Reason Reason
	// Code is the error's gRPC code: OK for a nil error, UNKNOWN for an
	// error without a status, CANCELLED or DEADLINE_EXCEEDED for a bare
	// context error.
	Code codes.Code
	// Detail is the tollgate detail the error carries, or nil. It is the
	// caller's to keep; it is not shared with the error. Its strings are
	// bounded whatever a peer sent: an attempt ID longer than 64 bytes or a
	// call key longer than 128 (the tollgate header's bounds, which no
	// tollgate peer exceeds) reads as "…", which names no attempt or call
	// (and, like the long string, equals no identifier and not ""), and a
	// class longer than 256 bytes reads as "" (see the package doc,
	// # Reading an error).
	Detail *tollgatev1.OutcomeDetail
}

// Final reports whether the outcome's detail says no repeat of the attempt can
// help; it is false without a detail. Definite errors are not final in this
// sense: they simply end the call.
func (o Outcome) Final() bool { return o.Detail.GetFinal() }

// Delivery is what a client knows of whether its request reached the peer,
// from the call's stats (DESIGN.md §6). Its zero value, MaybeSent, is the
// conservative one.
type Delivery uint8

const (
	// MaybeSent means the request's headers were queued (stats OutHeader)
	// and the peer's status did not arrive.
	MaybeSent Delivery = iota
	// NotSent means the request provably never left the client (no
	// OutHeader).
	NotSent
	// PeerStatus means the peer's status arrived (stats InTrailer).
	PeerStatus
)

// String returns the delivery's name, for example "NOT_SENT", or "INVALID"
// for a value not declared here.
func (d Delivery) String() string {
	switch d {
	case MaybeSent:
		return "MAYBE_SENT"
	case NotSent:
		return "NOT_SENT"
	case PeerStatus:
		return "PEER_STATUS"
	}
	return "INVALID"
}

// OutcomeOf classifies any error by what it carries, as the package doc says:
// a tollgate detail first, then context errors, then the gRPC code. A nil
// error is [KindOK]. It looks at the error that decides the gRPC status
// (the first one in the chain that has a GRPCStatus method, as
// grpc/status.FromError does), so a tollgate error wrapped in another status
// error is not mistaken for the status that is sent. It never panics, and
// detail bytes that do not decode are ignored.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return Outcome{Kind: KindOK, Code: codes.OK}
	}
	x := inspect(err)
	if o, ok := x.outcome(); ok {
		return o
	}
	if x.ctxErr || !definite(x.code) {
		return Outcome{Kind: KindUnknown, Code: x.code}
	}
	return Outcome{Kind: KindFailed, Code: x.code}
}

// OutcomeOfCall classifies the error a client's call ended with, using what
// the client knows of its delivery. An error with a tollgate detail is
// classified by the detail, as [OutcomeOf] does; otherwise: never sent with
// a definite code (a client-side failure that no repeat can mend: credentials
// refused UNAUTHENTICATED, an inner interceptor's INVALID_ARGUMENT) → FAILED;
// never sent with any other code → NOT_ADMITTED, NOT_SENT; the peer's status
// arrived with a definite code →
// FAILED; the peer's status arrived with any other code → UNKNOWN; no peer
// status → UNKNOWN, CALL_LOST. A Delivery value not declared here counts as
// [MaybeSent]. A nil error is [KindOK].
func OutcomeOfCall(err error, d Delivery) Outcome {
	if err == nil {
		return Outcome{Kind: KindOK, Code: codes.OK}
	}
	x := inspect(err)
	if o, ok := x.outcome(); ok {
		return o
	}
	switch d {
	case NotSent:
		if definite(x.code) && !x.ctxErr {
			return Outcome{Kind: KindFailed, Code: x.code}
		}
		return Outcome{Kind: KindNotAdmitted, Reason: ReasonNotSent, Code: x.code}
	case PeerStatus:
		if definite(x.code) && !x.ctxErr {
			return Outcome{Kind: KindFailed, Code: x.code}
		}
		return Outcome{Kind: KindUnknown, Code: x.code}
	default:
		return Outcome{Kind: KindUnknown, Reason: ReasonCallLost, Code: x.code}
	}
}

// HandlerOutcome classifies the error a server's handler returned, for the
// call's record and for the answer the server sends (DESIGN.md §3.6).
// noSideEffects is true when the method is declared NO_SIDE_EFFECTS (a method
// declared IDEMPOTENT has effects and does not qualify).
//
// A NOT_ADMITTED detail stays NOT_ADMITTED, with its reason and detail, only
// when the handler wrapped the error with [WithoutEffect] or noSideEffects is
// true. Any other tollgate detail (NOT_ADMITTED, UNKNOWN, COMMITTED, a
// mismatch) came from below a handler that ran, so the call's outcome is
// UNKNOWN, with no reason and no detail (the detail found describes the call
// below, not this one: its reason and final flag do not apply here; read it
// with [OutcomeOf] if needed), and its Code is the code [OutcomeUnknown] would
// send for err. Without a detail, definite codes are FAILED and all others
// (context errors included) UNKNOWN. A nil error is [KindOK].
func HandlerOutcome(err error, noSideEffects bool) Outcome {
	if err == nil {
		return Outcome{Kind: KindOK, Code: codes.OK}
	}
	x := inspect(err)
	o, ok := x.outcome()
	if !ok {
		if x.ctxErr || !definite(x.code) {
			return Outcome{Kind: KindUnknown, Code: x.code}
		}
		return Outcome{Kind: KindFailed, Code: x.code}
	}
	if o.Kind == KindNotAdmitted && (noSideEffects || x.withoutEffect) {
		return o
	}
	return Outcome{Kind: KindUnknown, Code: unknownCode(o.Code)}
}

// grpcStatuser is what grpc/status.FromError looks for.
type grpcStatuser interface{ GRPCStatus() *grpcstatus.Status }

// inspection is what an error carries, found in one walk of its chain.
type inspection struct {
	te            *Error                    // the tollgate error that decides the status
	st            *grpcstatus.Status        // else the status of the first error that has one
	detail        *tollgatev1.OutcomeDetail // decoded from st
	retryInfo     time.Duration             // from st's RetryInfo, if valid and positive
	code          codes.Code
	ctxErr        bool // err is or wraps a context error
	withoutEffect bool // a WithoutEffect wrapper encloses te or st
	// nilStatus is set when the first error with a GRPCStatus method had a
	// nil status: as for grpc-go's status.FromError, it decides (there is
	// no status), and no later branch of a join is looked at.
	nilStatus bool
}

// inspect walks err's chain as errors.As does (depth first, Unwrap() error
// and Unwrap() []error) and stops at the first error with a GRPCStatus method,
// looking through WithoutEffect wrappers. It follows at most maxDepth levels.
func inspect(err error) inspection {
	var x inspection
	if !x.find(err, 0) {
		x.te, x.st = nil, nil
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			x.code, x.ctxErr = codes.DeadlineExceeded, true
		case errors.Is(err, context.Canceled):
			x.code, x.ctxErr = codes.Canceled, true
		default:
			x.code = codes.Unknown
		}
		return x
	}
	if x.te != nil {
		x.code = x.te.Code()
		return x
	}
	// A status error that also wraps a context error (not one grpc-go
	// makes) is still a caller that stopped waiting.
	x.ctxErr = errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
	x.code = x.st.Code()
	if x.code == codes.OK { // a non-nil error that claims OK: not a success
		x.code = codes.Unknown
	}
	for _, d := range x.st.Details() {
		switch v := d.(type) {
		case *tollgatev1.OutcomeDetail:
			if x.detail == nil {
				x.detail = boundDetail(v) // decoded afresh: ours to change
			}
		case *errdetails.RetryInfo:
			if rd := v.GetRetryDelay(); x.retryInfo == 0 && rd.IsValid() && rd.AsDuration() > 0 {
				x.retryInfo = rd.AsDuration()
			}
		}
	}
	return x
}

// maxDepth bounds the walk of pathological (cyclic or very deep) chains.
const maxDepth = 100

// find reports whether it found the error that decides err's status. It
// sets x.withoutEffect only when a WithoutEffect wrapper encloses what it
// found, not one on a branch of a join that led nowhere.
func (x *inspection) find(err error, depth int) bool {
	without := false
	found := func() bool {
		x.withoutEffect = x.withoutEffect || without
		return true
	}
	for err != nil && depth < maxDepth {
		depth++
		switch v := err.(type) {
		case *Error:
			if v == nil {
				x.nilStatus = true
				return false
			}
			x.te = v
			return found()
		case *withoutEffect:
			// Looked through, but it has a GRPCStatus method: when what it
			// wraps has no status, it is the first status-bearing error,
			// with a nil status, as grpc-go's errors.As finds it.
			without = true
			if v == nil {
				x.nilStatus = true
				return false
			}
			if x.find(v.err, depth) {
				return found()
			}
			x.nilStatus = true
			return false
		case grpcStatuser:
			if st := v.GRPCStatus(); st != nil {
				x.st = st
				return found()
			}
			x.nilStatus = true // grpc-go treats a nil status as no status
			return false
		case interface{ As(any) bool }:
			var gs grpcStatuser
			if v.As(&gs) && gs != nil {
				if e, ok := gs.(error); ok {
					return x.find(e, depth) && found()
				}
				if x.st = gs.GRPCStatus(); x.st != nil {
					return found()
				}
				x.nilStatus = true
				return false
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if x.find(e, depth) {
					return found()
				}
				if x.nilStatus {
					return false // the first status-bearing error decided: none
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// outcome classifies by the tollgate detail, if there is one.
func (x *inspection) outcome() (Outcome, bool) {
	switch {
	case x.te != nil:
		return detailOutcome(x.te.Detail(), x.code), true
	case x.detail != nil:
		return detailOutcome(x.detail, x.code), true
	}
	return Outcome{}, false
}

// final reports the detail's final flag without building a detail.
func (x *inspection) final() bool {
	if x.te != nil {
		return x.te.f.Final
	}
	return x.detail.GetFinal()
}

// kind is the Kind the detail decides, and false when there is none.
func (x *inspection) kind() (Kind, bool) {
	switch {
	case x.te != nil:
		return detailKind(x.te.outcome, x.te.reason), true
	case x.detail != nil:
		return detailKind(x.detail.GetOutcome(), x.detail.GetReason()), true
	}
	return 0, false
}

// retryAfter is RetryInfo's delay if valid and positive, else the detail's.
func (x *inspection) retryAfter() (time.Duration, bool) {
	if x.te != nil {
		return x.te.f.RetryAfter, x.te.f.RetryAfter > 0
	}
	if x.retryInfo > 0 {
		return x.retryInfo, true
	}
	if ra := x.detail.GetRetryAfter(); ra.IsValid() && ra.AsDuration() > 0 {
		return ra.AsDuration(), true
	}
	return 0, false
}

func detailOutcome(d *tollgatev1.OutcomeDetail, code codes.Code) Outcome {
	return Outcome{Kind: detailKind(d.GetOutcome(), d.GetReason()), Reason: d.GetReason(), Code: code, Detail: d}
}

func detailKind(outcome tollgatev1.Outcome, reason Reason) Kind {
	switch {
	case reason == ReasonAttemptRequestMismatch:
		return KindFailed
	case outcome == tollgatev1.Outcome_OUTCOME_NOT_ADMITTED:
		return KindNotAdmitted
	case outcome == tollgatev1.Outcome_OUTCOME_COMMITTED:
		return KindCommitted
	default:
		// UNKNOWN, UNSPECIFIED and any outcome this build does not know:
		// the caller cannot rule out an effect.
		return KindUnknown
	}
}

// RetryAfter returns the delay err suggests before a repeat: the delay of a
// google.rpc.RetryInfo in its status if present, valid and positive, else the
// tollgate detail's retry_after if valid and positive (an UNKNOWN or
// COMMITTED outcome this package builds carries its delay in the detail
// alone: see [WithRetryAfter]). It reads a delay whatever the outcome: the
// caller decides whether a repeat may follow ([OutcomeOf]). ok is false when err
// suggests none (nil errors included). Like [OutcomeOf], it reads the status
// of the first error in the chain that has one.
func RetryAfter(err error) (d time.Duration, ok bool) {
	if err == nil {
		return 0, false
	}
	x := inspect(err)
	return x.retryAfter()
}

// IsFinal reports whether err carries a tollgate detail marked final: no
// repeat of this attempt can help, the caller must decide anew. It is false
// for nil and for errors without a detail.
func IsFinal(err error) bool {
	if err == nil {
		return false
	}
	x := inspect(err)
	return x.final()
}

// WithoutEffect declares that the handler's error left no effect: the
// NOT_ADMITTED outcome it carries (typically a refusal from a call the handler
// made before changing anything) may be reported to the caller as NOT_ADMITTED
// rather than UNKNOWN (see [HandlerOutcome]). It changes nothing else: the
// error's message, gRPC status and errors.Is/As behave as the wrapped
// error's, and an error without a NOT_ADMITTED detail is classified as it
// would be without it. nil stays nil.
func WithoutEffect(err error) error {
	if err == nil {
		return nil
	}
	return &withoutEffect{err: err}
}

type withoutEffect struct{ err error }

func (w *withoutEffect) Error() string { return w.err.Error() }
func (w *withoutEffect) Unwrap() error { return w.err }

// GRPCStatus lets the wrapper cross gRPC exactly as the error it wraps: the
// wrapped error's status, or nil when it has none, so that grpc-go still maps
// a wrapped context error to CANCELLED or DEADLINE_EXCEEDED.
func (w *withoutEffect) GRPCStatus() *grpcstatus.Status {
	if st, ok := grpcstatus.FromError(w.err); ok {
		return st
	}
	return nil
}

// codeOf returns the code [OutcomeOf] reads from err.
func codeOf(err error) codes.Code { return inspect(err).code }

// definite reports whether code proves the peer processed and refused the
// request without the effect being in doubt (DESIGN.md §2.5).
func definite(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated:
		return true
	}
	return false
}

// IsDefinite reports whether code is one of the definite codes of the wire
// contract: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED, UNAUTHENTICATED.
func IsDefinite(code codes.Code) bool { return definite(code) }

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

// Kind is what a caller may conclude about a call's effect.
type Kind uint8

const (
	// KindOK: the call succeeded.
	KindOK Kind = iota
	// KindFailed: the call ended with a definite error (or a request
	// mismatch); repeating it cannot help.
	KindFailed
	// KindNotAdmitted: the call had no effect at the answering tier or below.
	KindNotAdmitted
	// KindUnknown: the call may or may not have had its effect.
	KindUnknown
	// KindCommitted: the effect happened; the response is not available.
	KindCommitted
)

var kindNames = [...]string{"OK", "FAILED", "NOT_ADMITTED", "UNKNOWN", "COMMITTED"}

// String returns the kind's name, for example "NOT_ADMITTED".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "INVALID"
}

// Outcome is the classification of an error.
type Outcome struct {
	// Kind is what the caller may conclude about the effect.
	Kind Kind
	// Reason is the tollgate reason, when one is known.
	Reason Reason
	// Code is the error's gRPC code (OK for a nil error).
	Code codes.Code
	// Detail is the tollgate detail the error carries, or nil. It is the
	// caller's to keep; it is not shared with the error.
	Detail *tollgatev1.OutcomeDetail
}

// Final reports whether the outcome's detail says no repeat of the attempt can
// help. Definite errors are not final in this sense: they simply end the call.
func (o Outcome) Final() bool { return o.Detail.GetFinal() }

// Delivery is what a client knows of whether its request reached the peer,
// from the call's stats (DESIGN.md §6). Its zero value, MaybeSent, is the
// conservative one.
type Delivery uint8

const (
	// MaybeSent: the request's headers were queued (stats OutHeader) and the
	// peer's status did not arrive.
	MaybeSent Delivery = iota
	// NotSent: the request provably never left the client (no OutHeader).
	NotSent
	// PeerStatus: the peer's status arrived (stats InTrailer).
	PeerStatus
)

// OutcomeOf classifies any error by what it carries, as the package doc's
// table says: a tollgate detail first, then context errors, then the gRPC code.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return Outcome{Kind: KindOK, Code: codes.OK}
	}
	if o, ok := fromDetail(err); ok {
		return o
	}
	code := codeOf(err)
	if isContextErr(err) || !definite(code) {
		return Outcome{Kind: KindUnknown, Code: code}
	}
	return Outcome{Kind: KindFailed, Code: code}
}

// OutcomeOfCall classifies the error a client's call ended with, using what
// the client knows of its delivery. An error with a tollgate detail is
// classified by the detail; otherwise: never sent → NOT_ADMITTED, NOT_SENT;
// the peer's status arrived with a definite code → FAILED; the peer's status
// arrived with any other code → UNKNOWN; no peer status → UNKNOWN, CALL_LOST.
func OutcomeOfCall(err error, d Delivery) Outcome {
	if err == nil {
		return Outcome{Kind: KindOK, Code: codes.OK}
	}
	if o, ok := fromDetail(err); ok {
		return o
	}
	code := codeOf(err)
	switch d {
	case NotSent:
		return Outcome{Kind: KindNotAdmitted, Reason: ReasonNotSent, Code: code}
	case PeerStatus:
		if definite(code) && !isContextErr(err) {
			return Outcome{Kind: KindFailed, Code: code}
		}
		return Outcome{Kind: KindUnknown, Code: code}
	default:
		return Outcome{Kind: KindUnknown, Reason: ReasonCallLost, Code: code}
	}
}

// HandlerOutcome classifies the error a server's handler returned, for the
// call's record and for the answer the server sends (DESIGN.md §3.6).
// noSideEffects is true when the method is declared NO_SIDE_EFFECTS.
//
// A NOT_ADMITTED detail stays NOT_ADMITTED only when the handler wrapped the
// error with [WithoutEffect] or noSideEffects is true. Any other tollgate
// detail (NOT_ADMITTED, UNKNOWN, COMMITTED, a mismatch) came from below a
// handler that ran, so the call's outcome is UNKNOWN; its Detail is the one
// found and its Code the underlying code as [OutcomeUnknown] would send it.
// Without a detail, definite codes are FAILED and all others UNKNOWN.
func HandlerOutcome(err error, noSideEffects bool) Outcome {
	if err == nil {
		return Outcome{Kind: KindOK, Code: codes.OK}
	}
	o, ok := fromDetail(err)
	if !ok {
		return OutcomeOf(err)
	}
	if o.Kind == KindNotAdmitted && o.Reason != ReasonAttemptRequestMismatch &&
		(noSideEffects || isWithoutEffect(err)) {
		return o
	}
	return Outcome{Kind: KindUnknown, Code: unknownCode(o.Code), Detail: o.Detail}
}

// fromDetail finds a tollgate detail in err and classifies by it.
func fromDetail(err error) (Outcome, bool) {
	var te *Error
	if errors.As(err, &te) {
		return detailOutcome(te.Detail(), te.code), true
	}
	st, ok := grpcstatus.FromError(err)
	if !ok {
		return Outcome{}, false
	}
	if d := findDetail(st); d != nil {
		return detailOutcome(d, st.Code()), true
	}
	return Outcome{}, false
}

func detailOutcome(d *tollgatev1.OutcomeDetail, code codes.Code) Outcome {
	o := Outcome{Reason: d.GetReason(), Code: code, Detail: d}
	switch {
	case d.GetReason() == ReasonAttemptRequestMismatch:
		o.Kind = KindFailed
	case d.GetOutcome() == tollgatev1.Outcome_OUTCOME_NOT_ADMITTED:
		o.Kind = KindNotAdmitted
	case d.GetOutcome() == tollgatev1.Outcome_OUTCOME_COMMITTED:
		o.Kind = KindCommitted
	default:
		// UNKNOWN, and any outcome this build does not know: the caller
		// cannot rule out an effect.
		o.Kind = KindUnknown
	}
	return o
}

// findDetail returns the first OutcomeDetail among st's details. Details that
// do not decode are skipped.
func findDetail(st *grpcstatus.Status) *tollgatev1.OutcomeDetail {
	for _, d := range st.Details() {
		if od, ok := d.(*tollgatev1.OutcomeDetail); ok {
			return od
		}
	}
	return nil
}

// RetryAfter returns the delay err suggests before a repeat: a
// google.rpc.RetryInfo's delay if present, else the tollgate detail's
// retry_after. ok is false when err suggests none.
func RetryAfter(err error) (d time.Duration, ok bool) {
	if err == nil {
		return 0, false
	}
	var te *Error
	if errors.As(err, &te) {
		return te.f.RetryAfter, te.f.RetryAfter > 0
	}
	st, isStatus := grpcstatus.FromError(err)
	if !isStatus {
		return 0, false
	}
	var fromDetail time.Duration
	for _, det := range st.Details() {
		switch v := det.(type) {
		case *errdetails.RetryInfo:
			if rd := v.GetRetryDelay(); rd != nil && rd.IsValid() && rd.AsDuration() > 0 {
				return rd.AsDuration(), true
			}
		case *tollgatev1.OutcomeDetail:
			if ra := v.GetRetryAfter(); ra != nil && ra.IsValid() && ra.AsDuration() > 0 && fromDetail == 0 {
				fromDetail = ra.AsDuration()
			}
		}
	}
	return fromDetail, fromDetail > 0
}

// IsFinal reports whether err carries a tollgate detail marked final: no
// repeat of this attempt can help, the caller must decide anew.
func IsFinal(err error) bool {
	o, ok := fromDetail(err)
	return ok && o.Final()
}

// WithoutEffect declares that the handler's error left no effect: the
// NOT_ADMITTED outcome it carries (typically a refusal from a call the handler
// made before changing anything) may be reported to the caller as NOT_ADMITTED
// rather than UNKNOWN. It changes nothing else: an error without a
// NOT_ADMITTED detail is classified as it would be without it. nil stays nil.
func WithoutEffect(err error) error {
	if err == nil {
		return nil
	}
	return &withoutEffect{err: err}
}

type withoutEffect struct{ err error }

func (w *withoutEffect) Error() string { return w.err.Error() }
func (w *withoutEffect) Unwrap() error { return w.err }

// GRPCStatus lets the wrapper cross gRPC exactly as the error it wraps.
func (w *withoutEffect) GRPCStatus() *grpcstatus.Status {
	st, _ := grpcstatus.FromError(w.err)
	return st
}

func isWithoutEffect(err error) bool {
	var w *withoutEffect
	return errors.As(err, &w)
}

// codeOf returns err's gRPC code, mapping bare context errors to CANCELLED and
// DEADLINE_EXCEEDED.
func codeOf(err error) codes.Code {
	if st, ok := grpcstatus.FromError(err); ok {
		return st.Code()
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Unknown
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

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

package status

import (
	"time"

	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Error is a tollgate outcome carried as an error: a refusal (NOT_ADMITTED),
// an unresolved outcome (UNKNOWN), an effect whose response is lost
// (COMMITTED) or a request mismatch. Build one with [NotAdmitted],
// [OutcomeUnknown], [Committed] or [RequestMismatch]; the zero value is not
// useful. An Error is immutable once built and safe for concurrent use.
//
// Error satisfies GRPCStatus, so a server may return it (or wrap it with %w)
// and grpc-go sends the status with its details.
type Error struct {
	code    codes.Code
	msg     string
	cause   error
	outcome tollgatev1.Outcome
	reason  Reason
	f       Fields
}

// Fields are the optional data of a tollgate outcome. Every field's zero value
// means "not set". Fields is itself an [Option]: passing one Fields value
// sets several at the cost of one allocation.
type Fields struct {
	// AttemptID is the attempt's identity.
	AttemptID string
	// Call is the call key of the refused or unresolved call.
	Call string
	// Try is the try number that was refused or left unresolved.
	Try uint32
	// RetryAfter is the suggested least delay before a repeat. When positive,
	// the status also carries a google.rpc.RetryInfo.
	RetryAfter time.Duration
	// Class is the admission class that refused the call.
	Class string
	// UnitsRemaining is the number of free allowance units at the refusing ledger.
	UnitsRemaining int64
	// Final marks a refusal after which no repeat of the attempt can help.
	Final bool
	// FencedThroughTry is, with ATTEMPT_FENCED, the highest try that can never run.
	FencedThroughTry uint32
	// Message is appended to the status message after ": ".
	Message string
}

// Option adds data to an outcome built by this package's constructors.
type Option interface{ apply(*Error) }

func (f Fields) apply(e *Error) {
	if f.AttemptID != "" {
		e.f.AttemptID = f.AttemptID
	}
	if f.Call != "" {
		e.f.Call = f.Call
	}
	if f.Try != 0 {
		e.f.Try = f.Try
	}
	if f.RetryAfter > 0 {
		e.f.RetryAfter = f.RetryAfter
	}
	if f.Class != "" {
		e.f.Class = f.Class
	}
	if f.UnitsRemaining != 0 {
		e.f.UnitsRemaining = f.UnitsRemaining
	}
	if f.Final {
		e.f.Final = true
	}
	if f.FencedThroughTry != 0 {
		e.f.FencedThroughTry = f.FencedThroughTry
	}
	if f.Message != "" {
		e.f.Message = f.Message
	}
}

type optionFunc func(*Error)

func (o optionFunc) apply(e *Error) { o(e) }

// WithAttempt names the attempt and the call's try.
func WithAttempt(attemptID, call string, try uint32) Option {
	return Fields{AttemptID: attemptID, Call: call, Try: try}
}

// WithRetryAfter suggests the least delay before a repeat. Non-positive
// durations are ignored.
func WithRetryAfter(d time.Duration) Option { return Fields{RetryAfter: d} }

// WithClass names the admission class that refused the call.
func WithClass(class string) Option { return Fields{Class: class} }

// WithUnitsRemaining reports the free allowance units at the refusing ledger.
func WithUnitsRemaining(n int64) Option {
	return optionFunc(func(e *Error) { e.f.UnitsRemaining = n })
}

// Final marks the outcome as final: no repeat of this attempt can help.
func Final() Option { return optionFunc(func(e *Error) { e.f.Final = true }) }

// WithFencedThroughTry reports, with ATTEMPT_FENCED, the highest try that can
// never run.
func WithFencedThroughTry(n uint32) Option { return Fields{FencedThroughTry: n} }

// WithMessage appends msg to the status message.
func WithMessage(msg string) Option { return Fields{Message: msg} }

// WithCode overrides the gRPC code the constructor chose. Use it only to keep
// a more precise code of the same family; the detail stays authoritative.
func WithCode(c codes.Code) Option { return optionFunc(func(e *Error) { e.code = c }) }

// WithReason sets the reason of an [OutcomeUnknown] or [Committed] outcome
// (for example CALL_LOST or ATTEMPT_UNVERIFIABLE).
func WithReason(r Reason) Option { return optionFunc(func(e *Error) { e.reason = r }) }

func build(e *Error, opts []Option) *Error {
	for _, o := range opts {
		if o != nil {
			o.apply(e)
		}
	}
	if e.f.Message != "" {
		e.msg += ": " + e.f.Message
	}
	return e
}

// NotAdmitted returns a refusal: the call had no effect at this tier or below.
// Its code follows the reason: UNAVAILABLE for DRAINING, STORE_UNAVAILABLE,
// NOT_SENT and ATTEMPT_UNVERIFIABLE; INVALID_ARGUMENT for MALFORMED_HEADER and
// CALL_KEY_REQUIRED (which are always final); RESOURCE_EXHAUSTED for the rest.
func NotAdmitted(reason Reason, opts ...Option) error {
	info := infoOf(reason)
	e := &Error{
		code:    info.code,
		msg:     "tollgate: not admitted: " + info.message,
		outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED,
		reason:  reason,
	}
	if info.code == codes.InvalidArgument {
		e.f.Final = true
	}
	return build(e, opts)
}

// OutcomeUnknown returns an unresolved outcome: the call may or may not have
// had its effect, and must not be repeated before its state is queried. The
// code is the cause's code, except that OK, UNAVAILABLE and RESOURCE_EXHAUSTED
// become UNKNOWN so that generic retry policies do not repeat it blindly.
// cause may be nil; it is returned by Unwrap.
func OutcomeUnknown(cause error, opts ...Option) error {
	code := codes.Unknown
	msg := "tollgate: outcome unknown"
	if cause != nil {
		code = unknownCode(codeOf(cause))
		msg += ": " + cause.Error()
	}
	e := &Error{
		code:    code,
		msg:     msg,
		cause:   cause,
		outcome: tollgatev1.Outcome_OUTCOME_UNKNOWN,
	}
	return build(e, opts)
}

// Committed returns the outcome of a call whose effect took place but whose
// response cannot be returned (not retained, or a stream): FAILED_PRECONDITION,
// reason RESPONSE_NOT_RETAINED, final.
func Committed(opts ...Option) error {
	e := &Error{
		code:    codes.FailedPrecondition,
		msg:     "tollgate: committed: response not retained",
		outcome: tollgatev1.Outcome_OUTCOME_COMMITTED,
		reason:  ReasonResponseNotRetained,
		f:       Fields{Final: true},
	}
	return build(e, opts)
}

// RequestMismatch returns the refusal of a call key reused with a different
// method or request: INVALID_ARGUMENT, reason ATTEMPT_REQUEST_MISMATCH, final.
// existing is what the existing record says of its own effect
// (OUTCOME_COMMITTED, OUTCOME_UNKNOWN, or OUTCOME_NOT_ADMITTED for a
// tombstone); it becomes the detail's outcome.
func RequestMismatch(existing tollgatev1.Outcome, opts ...Option) error {
	e := &Error{
		code:    codes.InvalidArgument,
		msg:     "tollgate: request does not match the call key's record",
		outcome: existing,
		reason:  ReasonAttemptRequestMismatch,
		f:       Fields{Final: true},
	}
	return build(e, opts)
}

// Error returns the status message.
func (e *Error) Error() string { return e.msg }

// Unwrap returns the cause given to [OutcomeUnknown], or nil.
func (e *Error) Unwrap() error { return e.cause }

// Code returns the gRPC code the error is sent with.
func (e *Error) Code() codes.Code { return e.code }

// Reason returns the outcome's reason.
func (e *Error) Reason() Reason { return e.reason }

// Detail returns a new OutcomeDetail that describes the error.
func (e *Error) Detail() *tollgatev1.OutcomeDetail {
	d := &tollgatev1.OutcomeDetail{
		Outcome:          e.outcome,
		Reason:           e.reason,
		AttemptId:        e.f.AttemptID,
		Call:             e.f.Call,
		Try:              e.f.Try,
		WorkloadClass:    e.f.Class,
		UnitsRemaining:   e.f.UnitsRemaining,
		Final:            e.f.Final,
		FencedThroughTry: e.f.FencedThroughTry,
	}
	if e.f.RetryAfter > 0 {
		d.RetryAfter = durationpb.New(e.f.RetryAfter)
	}
	return d
}

// GRPCStatus returns the status that carries the error across gRPC: its code
// and message, the OutcomeDetail, a google.rpc.ErrorInfo and, when a delay was
// suggested, a google.rpc.RetryInfo.
func (e *Error) GRPCStatus() *grpcstatus.Status {
	details := make([]*anypb.Any, 0, 3)
	if d, err := anypb.New(e.Detail()); err == nil {
		details = append(details, d)
	}
	details = append(details, infoOf(e.reason).errorInfo)
	if e.f.RetryAfter > 0 {
		if ri, err := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(e.f.RetryAfter)}); err == nil {
			details = append(details, ri)
		}
	}
	return grpcstatus.FromProto(&spb.Status{Code: int32(e.code), Message: e.msg, Details: details})
}

// unknownCode is the code an UNKNOWN outcome carries for an underlying code c.
func unknownCode(c codes.Code) codes.Code {
	switch c {
	case codes.OK, codes.Unavailable, codes.ResourceExhausted:
		return codes.Unknown
	}
	return c
}

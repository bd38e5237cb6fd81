package status

import (
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Error is a tollgate outcome carried as an error: a refusal (NOT_ADMITTED),
// an unresolved outcome (UNKNOWN), an effect whose response is lost
// (COMMITTED) or a request mismatch. Build one with [NotAdmitted],
// [OutcomeUnknown], [Committed] or [RequestMismatch]; the zero value is not
// useful (it crosses gRPC as UNKNOWN, never as a success). An Error is immutable once built and safe for concurrent use.
//
// Error satisfies GRPCStatus, so a server may return it (or wrap it with %w)
// and grpc-go sends the status with its details. Find one in an error chain
// with errors.As, or classify any error with [OutcomeOf].
type Error struct {
	code    codes.Code
	msg     string
	cause   error
	outcome tollgatev1.Outcome
	reason  Reason
	f       Fields
	carried error // whose status details the status carries after its own (carriedDetails)

	st atomic.Pointer[grpcstatus.Status] // built by the first GRPCStatus call
}

// Fields are the optional data of a tollgate outcome. Every field's zero value
// means "not set", and applying a Fields never clears what an earlier option
// set. Fields is itself an [Option]: passing one Fields value sets several
// fields at once. Strings that are not valid UTF-8 are repaired (invalid bytes
// become U+FFFD), because protobuf cannot carry them.
type Fields struct {
	// AttemptID is the attempt's identity. One longer than 64 bytes, which
	// no tollgate peer sends (DESIGN.md §2.1), is replaced by "…", as a
	// received detail's is (see [Outcome]).
	AttemptID string
	// Call is the call key of the refused or unresolved call. One longer
	// than 128 bytes (DESIGN.md §2.1) is replaced by "…", as AttemptID is.
	Call string
	// Try is the try number that was refused or left unresolved.
	Try uint32
	// RetryAfter is the suggested least delay before a repeat, sent as the
	// detail's retry_after. When positive, a NOT_ADMITTED refusal's status
	// also carries a google.rpc.RetryInfo; an UNKNOWN or COMMITTED outcome's,
	// or a mismatch's, does not (see [WithRetryAfter]). Zero or negative
	// suggests none.
	RetryAfter time.Duration
	// Class is the admission class that refused the call. A name longer
	// than 256 bytes (once invalid UTF-8 is repaired, as a reader reads
	// it) is dropped: it would carry the detail past the bound
	// on what a status sends (a server passes on the class of a refusal
	// its handler returns).
	Class string
	// UnitsRemaining is the number of free allowance units at the refusing ledger.
	UnitsRemaining int64
	// Final marks a refusal after which no repeat of the attempt can help.
	Final bool
	// FencedThroughTry is, with ATTEMPT_FENCED, the highest try that can never run.
	FencedThroughTry uint32
	// Message is appended to the status message after ": ". A message
	// longer than the bound in the package doc (# Messages) is cut.
	Message string
}

// Option adds data to an outcome built by this package's constructors. The
// options are this package's: [Fields], [WithAttempt], [WithRetryAfter],
// [WithClass], [WithUnitsRemaining], [Final], [WithFencedThroughTry],
// [WithMessage], [WithCode], [WithReason] and [WithDetailsOf]. A nil Option
// is ignored.
type Option interface{ apply(*Error) }

func (f Fields) apply(e *Error) {
	if f.AttemptID != "" {
		e.f.AttemptID = bound(f.AttemptID, maxAttemptIDBytes, droppedIdentifier)
	}
	if f.Call != "" {
		e.f.Call = bound(f.Call, maxCallBytes, droppedIdentifier)
	}
	if f.Try != 0 {
		e.f.Try = f.Try
	}
	if f.RetryAfter > 0 {
		e.f.RetryAfter = f.RetryAfter
	}
	if c := bound(f.Class, maxDetailString, ""); c != "" { // as a reader reads it (boundDetail)
		e.f.Class = c
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

// The option types are small values, not closures, and build applies them
// through a type switch: the compiler then keeps them off the heap.
type (
	retryAfterOption time.Duration
	classOption      string
	unitsOption      int64
	finalOption      struct{}
	codeOption       codes.Code
	reasonOption     Reason
	detailsOption    struct{ err error }
)

func (o retryAfterOption) apply(e *Error) { Fields{RetryAfter: time.Duration(o)}.apply(e) }
func (o classOption) apply(e *Error)      { Fields{Class: string(o)}.apply(e) }
func (o unitsOption) apply(e *Error)      { e.f.UnitsRemaining = int64(o) }
func (finalOption) apply(e *Error)        { e.f.Final = true }
func (o codeOption) apply(e *Error)       { e.code = codes.Code(o) }
func (o reasonOption) apply(e *Error)     { e.reason = Reason(o) }
func (o detailsOption) apply(e *Error)    { e.carried = o.err }

// WithAttempt names the attempt and the call's try.
func WithAttempt(attemptID, call string, try uint32) Option {
	return Fields{AttemptID: attemptID, Call: call, Try: try}
}

// WithRetryAfter suggests the least delay before a repeat, in the
// OutcomeDetail's retry_after. A NOT_ADMITTED refusal's status then also
// carries a google.rpc.RetryInfo; an UNKNOWN or COMMITTED outcome's, and a
// mismatch's, does not, since it would invite a generic client to repeat a
// call that may have taken (or took) effect, or cannot succeed: there the
// delay is for tollgate's owner (an ATTEMPT_UNVERIFIABLE outcome's, until
// the store can vouch), which reads the detail, as [RetryAfter] does.
// Non-positive durations are ignored. Callers should derive it from the
// queue, never use a constant that synchronises clients.
func WithRetryAfter(d time.Duration) Option { return retryAfterOption(d) }

// WithClass names the admission class that refused the call (a name
// longer than 256 bytes is dropped, see [Fields]).
func WithClass(class string) Option { return classOption(class) }

// WithUnitsRemaining reports the free allowance units at the refusing ledger.
func WithUnitsRemaining(n int64) Option { return unitsOption(n) }

// Final marks the outcome as final: no repeat of this attempt can help.
func Final() Option { return finalOption{} }

// WithFencedThroughTry reports, with ATTEMPT_FENCED, the highest try that can
// never run.
func WithFencedThroughTry(n uint32) Option { return Fields{FencedThroughTry: n} }

// WithMessage appends ": " and msg to the status message. The whole message
// is bounded (1 KiB as grpc-message sends it; see the package doc,
// # Messages): a longer one loses its middle.
func WithMessage(msg string) Option { return Fields{Message: msg} }

// WithCode overrides the gRPC code the constructor chose, to keep a more
// precise code of the same family; the detail stays authoritative. It is
// ignored where it would break the wire contract: by [NotAdmitted] unless the
// code is RESOURCE_EXHAUSTED or UNAVAILABLE (and always for reasons sent as
// INVALID_ARGUMENT), by [Committed] and [RequestMismatch] always; and
// [OutcomeUnknown] turns OK, UNAVAILABLE, RESOURCE_EXHAUSTED and codes outside
// the gRPC range into UNKNOWN.
func WithCode(c codes.Code) Option { return codeOption(c) }

// WithReason sets the reason of an [OutcomeUnknown] or [Committed] outcome
// (for example CALL_LOST or ATTEMPT_UNVERIFIABLE), but never
// ATTEMPT_REQUEST_MISMATCH, which would read as a definite refusal
// ([RequestMismatch] builds that). [NotAdmitted] and [RequestMismatch]
// ignore it: their reason decides their code.
func WithReason(r Reason) Option { return reasonOption(r) }

// WithDetailsOf carries err's status details, but for tollgate's own, after
// the outcome's own details, in err's order: for an outcome rebuilt from an
// error a peer or a handler sent (a refusal re-addressed, a refusal's final
// flag changed, a try's error typed), so that the caller still gets what the
// other side said (a google.rpc.QuotaFailure, BadRequest, DebugInfo, a
// handler's own detail…). [OutcomeUnknown] carries its cause's details
// without it; WithDetailsOf replaces the error they are taken from, and
// WithDetailsOf(nil) carries none. What is not carried as it is (including
// what exceeds the bound of what is carried), and why, is in the package
// doc (# Details of another error). A later WithDetailsOf
// replaces an earlier one.
func WithDetailsOf(err error) Option { return detailsOption{err: err} }

// build applies opts to e, then restores what the constructor fixes
// (fixedCode, fixedReason) and finishes the message.
func build(e *Error, opts []Option, fixedCode, fixedReason bool) *Error {
	code, reason := e.code, e.reason
	for _, o := range opts {
		// A type switch, not o.apply: calling through the interface would
		// make every option escape to the heap.
		switch o := o.(type) {
		case Fields:
			o.apply(e)
		case retryAfterOption:
			o.apply(e)
		case classOption:
			o.apply(e)
		case unitsOption:
			o.apply(e)
		case finalOption:
			o.apply(e)
		case codeOption:
			o.apply(e)
		case reasonOption:
			o.apply(e)
		case detailsOption:
			o.apply(e)
		}
	}
	if fixedCode {
		e.code = code
	}
	if fixedReason {
		e.reason = reason
	} else if e.reason == ReasonAttemptRequestMismatch {
		// A mismatch reads FAILED whatever the outcome (a definite
		// refusal): on an UNKNOWN or COMMITTED outcome it would turn one
		// that must be resolved into a definite error.
		e.reason = reason
	}
	if e.f.Message != "" {
		e.msg += ": " + e.f.Message
	}
	e.msg = boundMessage(validUTF8(e.msg))
	return e
}

// maxMessageBytes bounds the message of an outcome this package builds, as
// grpc-message sends it (see the package doc, # Messages): tollgate puts
// another error's message in its own (an unknown outcome's cause, a
// re-addressed refusal's text, the last try of a spent retry budget), and
// the message goes on the wire twice, as grpc-message, percent-encoded, and
// inside grpc-status-details-bin, base64-encoded. With it, the message costs
// at most about 2.4 KiB of trailer, and with the bounds of carried details
// (maxCarriedBytes) a caller whose header list limit is 8 KiB gets the
// answer rather than an INTERNAL error.
const maxMessageBytes = 1 << 10

// cutMark stands where boundMessage cut a message.
const cutMark = "…"

// wireSize is the size of s as grpc-message sends it: grpc-go, like the
// gRPC spec, percent-encodes every byte outside printable ASCII, and '%'.
func wireSize(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '%' {
			n += 2
		}
	}
	return n
}

// boundMessage returns s (valid UTF-8) when its wireSize is at most
// maxMessageBytes, and otherwise its start and its end, whole runes, joined
// by cutMark within that size: the start says what tollgate concluded and the
// end what it added last, so both survive the cut of a long cause's text
// between them.
func boundMessage(s string) string {
	if len(s) <= maxMessageBytes/3 || wireSize(s) <= maxMessageBytes {
		return s
	}
	keep := maxMessageBytes - wireSize(cutMark)
	room := keep / 2
	head := 0
	for head < len(s) {
		_, n := utf8.DecodeRuneInString(s[head:])
		w := wireSize(s[head : head+n])
		if w > room {
			break
		}
		room -= w
		head += n
	}
	room += keep - keep/2 // what the start left, and the end's half
	tail := len(s)
	for tail > head {
		_, n := utf8.DecodeLastRuneInString(s[:tail])
		w := wireSize(s[tail-n : tail])
		if w > room {
			break
		}
		room -= w
		tail -= n
	}
	return s[:head] + cutMark + s[tail:]
}

// validUTF8 repairs s: grpc-go drops every status detail when the message
// does not marshal, and protobuf refuses invalid UTF-8 in strings.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// NotAdmitted returns a refusal: the call had no effect at this tier or below.
// Its code follows the reason: UNAVAILABLE for DRAINING, STORE_UNAVAILABLE,
// NOT_SENT and ATTEMPT_UNVERIFIABLE; INVALID_ARGUMENT for MALFORMED_HEADER,
// CALL_KEY_REQUIRED and ATTEMPT_REQUEST_MISMATCH (which are always final);
// RESOURCE_EXHAUSTED for the rest. The message is "tollgate: not admitted: "
// and the reason in words ("queue full"). reason is meant to be a refusal's
// reason; a value this build does not know is sent as it is, with the
// ErrorInfo reason "UNSPECIFIED" and RESOURCE_EXHAUSTED.
//
// A mismatch is not a refusal: NotAdmitted(ReasonAttemptRequestMismatch,
// opts...) returns RequestMismatch(OUTCOME_NOT_ADMITTED, opts...), the
// mismatch of a request with a tombstone (DESIGN.md §2.2), message and all.
// Its detail's outcome says what the record says (no try ran), while
// [OutcomeOf] reads it as [KindFailed], a definite error for this request,
// final, with no pushback ([Pushback]) and no google.rpc.RetryInfo.
//
// A handler that refuses a request itself, before doing anything, must say
// so with [WithoutEffect] (return status.WithoutEffect(status.NotAdmitted(…)))
// unless its method is declared NO_SIDE_EFFECTS: tollgate's server
// interceptor reads any other NOT_ADMITTED a handler returns as a refusal
// from below a handler that ran, and answers UNKNOWN (see [HandlerOutcome]),
// so the caller cannot repeat the call without querying its state.
func NotAdmitted(reason Reason, opts ...Option) error {
	if reason == ReasonAttemptRequestMismatch {
		return RequestMismatch(tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, opts...)
	}
	info := infoOf(reason)
	e := &Error{
		code:    info.code,
		msg:     info.message,
		outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED,
		reason:  reason,
	}
	if info.code == codes.InvalidArgument {
		e.f.Final = true
	}
	e = build(e, opts, false, true)
	if e.code != info.code && (info.code == codes.InvalidArgument ||
		e.code != codes.ResourceExhausted && e.code != codes.Unavailable) {
		e.code = info.code
	}
	return e
}

// OutcomeUnknown returns an unresolved outcome: the call may or may not have
// had its effect, and must not be repeated before its state is queried. The
// code is the cause's code (as [OutcomeOf] reads it), except that OK,
// UNAVAILABLE, RESOURCE_EXHAUSTED and codes outside the gRPC range become
// UNKNOWN so that generic retry policies do not repeat it blindly. The
// message is "tollgate: outcome unknown", then ": " and cause.Error() (for
// a gRPC status error, "rpc error: code = … desc = …"), unless the cause's
// status message already begins "tollgate: outcome unknown" (an unknown
// outcome from below, re-addressed here), which is then used instead;
// WithMessage appends to either. The message is bounded as the package doc
// says (# Messages): a long cause's text loses its middle.
// cause may be nil (the code is then UNKNOWN); it is returned by Unwrap. The
// reason is UNSPECIFIED unless [WithReason] sets one. Its status carries,
// after tollgate's own details, the cause's status details as
// [WithDetailsOf] carries them (never the cause's RetryInfo, which would
// invite a generic client to repeat what may have taken effect).
func OutcomeUnknown(cause error, opts ...Option) error {
	code := codes.Unknown
	msg := "tollgate: outcome unknown"
	if cause != nil {
		code = codeOf(cause)
		if s, ok := grpcstatus.FromError(cause); ok && strings.HasPrefix(s.Message(), msg) {
			msg = s.Message() // already an unknown outcome: say it once
		} else {
			msg += ": " + cause.Error()
		}
	}
	e := &Error{
		code:    code,
		msg:     msg,
		cause:   cause,
		outcome: tollgatev1.Outcome_OUTCOME_UNKNOWN,
		carried: cause,
	}
	e = build(e, opts, false, false)
	e.code = unknownCode(e.code)
	return e
}

// Committed returns the outcome of a call whose effect took place but whose
// response cannot be returned (not retained, or a stream):
// FAILED_PRECONDITION, reason RESPONSE_NOT_RETAINED unless [WithReason] sets
// another, final.
func Committed(opts ...Option) error {
	e := &Error{
		code:    codes.FailedPrecondition,
		msg:     "tollgate: committed: response not retained",
		outcome: tollgatev1.Outcome_OUTCOME_COMMITTED,
		reason:  ReasonResponseNotRetained,
		f:       Fields{Final: true},
	}
	return build(e, opts, true, false)
}

// RequestMismatch returns the refusal of a call key reused with a different
// method or request: INVALID_ARGUMENT, reason ATTEMPT_REQUEST_MISMATCH, final.
// existing is what the existing record says of its own effect
// (OUTCOME_COMMITTED, OUTCOME_UNKNOWN, or OUTCOME_NOT_ADMITTED for a
// tombstone); it becomes the detail's outcome. [OutcomeOf] classifies the
// refusal as [KindFailed] whatever existing says.
func RequestMismatch(existing tollgatev1.Outcome, opts ...Option) error {
	e := &Error{
		code:    codes.InvalidArgument,
		msg:     "tollgate: request does not match the call key's record",
		outcome: existing,
		reason:  ReasonAttemptRequestMismatch,
		f:       Fields{Final: true},
	}
	return build(e, opts, true, true)
}

// Error returns the status message.
func (e *Error) Error() string {
	if e == nil {
		return "tollgate: <nil>"
	}
	return e.msg
}

// Unwrap returns the cause given to [OutcomeUnknown], or nil.
func (e *Error) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.cause
}

// Code returns the gRPC code the error is sent with: UNKNOWN for a nil
// *Error and for the zero Error (an outcome is never sent as OK).
func (e *Error) Code() codes.Code {
	if e == nil || e.code == codes.OK {
		return codes.Unknown
	}
	return e.code
}

// Reason returns the outcome's reason; REASON_UNSPECIFIED for a nil *Error.
func (e *Error) Reason() Reason {
	if e == nil {
		return ReasonUnspecified
	}
	return e.reason
}

// Detail returns a new OutcomeDetail that describes the error, or nil for a
// nil *Error; the caller may keep and change it.
func (e *Error) Detail() *tollgatev1.OutcomeDetail {
	if e == nil {
		return nil
	}
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
// and message, the OutcomeDetail, a google.rpc.ErrorInfo and, when a
// NOT_ADMITTED refusal suggests a delay, a google.rpc.RetryInfo (see
// [WithRetryAfter]), in that order; then the details of
// the error it carries ([WithDetailsOf]; an unknown outcome's cause), but
// for tollgate's own, a RetryInfo, an ErrorInfo, whose data goes into
// tollgate's, and what exceeds a bound of a few KiB (see the package doc).
// The status is built on the
// first call and shared by later ones (a grpc-go Status is immutable). A nil
// *Error has no status (grpc-go then sends UNKNOWN).
func (e *Error) GRPCStatus() *grpcstatus.Status {
	if e == nil {
		return nil
	}
	if st := e.st.Load(); st != nil {
		return st
	}
	st := e.buildStatus()
	if !e.st.CompareAndSwap(nil, st) {
		return e.st.Load()
	}
	return st
}

// statusParts holds everything buildStatus needs in one allocation;
// grpcstatus.FromProto copies it.
type statusParts struct {
	s       spb.Status
	details [3]*anypb.Any
	detail  anypb.Any
	retry   anypb.Any
}

func (e *Error) buildStatus() *grpcstatus.Status {
	p := new(statusParts)
	detail, retry := e.encodeDetails()
	p.detail.TypeUrl, p.detail.Value = outcomeDetailURL, detail
	p.details[0] = &p.detail
	p.details[1] = infoOf(e.reason).errorInfo
	n := 2
	// Only a refusal sends a RetryInfo: on an UNKNOWN or COMMITTED outcome,
	// or a mismatch, it would invite a generic client to repeat a call
	// whose effect may have (or did) take place, or that cannot succeed.
	// The detail keeps its retry_after (tollgate's owner reads an
	// ATTEMPT_UNVERIFIABLE's there).
	if retry != nil && detailKind(e.outcome, e.reason) == KindNotAdmitted {
		p.retry.TypeUrl, p.retry.Value = retryInfoURL, retry
		p.details[2] = &p.retry
		n = 3
	}
	// Code turns the zero Error's OK into UNKNOWN: an outcome is never a
	// success, and a status with code OK would answer the call as one.
	code := e.Code()
	p.s.Code, p.s.Message, p.s.Details = int32(code), e.msg, p.details[:n:n]
	if e.carried != nil {
		others, cause := carriedDetails(e.carried)
		if cause != nil {
			p.details[1] = e.errorInfoWith(cause)
		}
		p.s.Details = append(p.s.Details, others...)
	}
	return grpcstatus.FromProto(&p.s)
}

// ErrorInfo metadata keys under which tollgate's ErrorInfo keeps the
// ErrorInfo of the error an outcome carries (see the package doc).
const (
	causeDomainKey   = "cause_domain"
	causeReasonKey   = "cause_reason"
	causeMetadataKey = "cause_md_" // followed by the carried ErrorInfo's own key
)

// Bounds of what an outcome carries of another error's status (see the
// package doc): the details it keeps (each counted by its size in the status
// as sent, detailSize), and the cause_ entries of its ErrorInfo (each by its key
// and value). A status is sent as the grpc-status-details-bin trailer,
// base64-encoded, beside grpc-message; without a bound a rebuilt status
// forwards whatever the peer or handler sent, however large, and a caller
// whose header list limit is lower than the peer's (grpc-java's and gRPC
// C++'s default is 8 KiB) loses the whole answer, refusal and all, as an
// INTERNAL error. With these, tollgate's details and the carried ones stay
// within about 5 KiB of trailer besides the message.
const (
	maxCarriedBytes = 3 << 10
	maxCauseBytes   = 512
)

// Bounded returns err with its gRPC status bounded as the outcomes this
// package builds are (see # Messages): its message cut in the middle to at
// most 1 KiB as grpc-message sends it (invalid UTF-8 replaced), and its
// details kept, in their order, while they fit in 3 KiB, each counted by
// its size in the status as sent, protobuf framing included (a detail that
// does not fit is dropped). The google.rpc.RetryInfo whose delay
// [RetryAfter] reads, if any, and the tollgate OutcomeDetail that
// [OutcomeOf] classifies err by, if any, are counted first and always kept,
// so that the bound never changes what err reads as or the delay it
// suggests: the RetryInfo rebuilt by its delay alone when it carries more;
// the OutcomeDetail, when larger than the 3 KiB less the RetryInfo, kept by
// what it says (its outcome, reason, final flag, try, retry_after, units
// and fence; its attempt ID, call and class as [Outcome]'s Detail reads
// them, which bounds them), rebuilt without unknown fields under the
// standard type URL. The google.rpc.ErrorInfo whose domain, reason and
// metadata an outcome rebuilt from err carries as its own ErrorInfo's
// cause_ entries (the first that decodes and gives some; see # Details of
// another error) is counted next and kept while it fits in what those
// leave, so that the bound does not lose why err failed on its way up: as
// it is, or, when larger, by what gives those entries (its domain and
// reason, and the metadata entries taken), rebuilt under the standard type
// URL; any other ErrorInfo is one more detail (but, when that one is not
// kept, a later one that gives cause_ entries is dropped, since an outcome
// would read it in its place: the bound may lose the cause, never swap it).
// Its code is kept (but a non-nil error whose status claims OK, which
// OutcomeOf reads as UNKNOWN, is UNKNOWN once rebuilt, not a success). It
// returns err itself when its status is within both bounds, and when err
// carries no gRPC status. Otherwise it returns a new error, which keeps of
// err's chain only its status, and a [WithoutEffect] that encloses the
// error deciding it (so [HandlerOutcome] reads the result as it reads err).
// tollgate's server bounds so a definite error a handler returns, which it
// passes up unchanged otherwise, before it answers with it and records it.
func Bounded(err error) error {
	st, ok := grpcstatus.FromError(err)
	if !ok || st == nil {
		return err
	}
	p := st.Proto()
	size := 0
	for _, d := range p.GetDetails() {
		size += detailSize(d)
	}
	msg := boundMessage(validUTF8(p.GetMessage()))
	if msg == p.GetMessage() && size <= maxCarriedBytes {
		return err
	}
	var details []*anypb.Any
	room := maxCarriedBytes
	deciding, od := decidingDetail(p.GetDetails())
	retry, delay := retryDetail(p.GetDetails())
	var kept, keptRetry *anypb.Any
	if retry >= 0 {
		keptRetry = p.GetDetails()[retry]
		if rebuilt := retryInfoOf(delay); detailSize(keptRetry) > detailSize(rebuilt) {
			keptRetry = rebuilt
		}
		room -= detailSize(keptRetry)
	}
	if deciding >= 0 {
		kept = p.GetDetails()[deciding]
		if detailSize(kept) > room {
			kept = boundedOutcomeDetail(od)
		}
		room = max(room-detailSize(kept), 0)
	}
	info, ei, cause := causeDetail(p.GetDetails())
	var keptInfo *anypb.Any
	if info >= 0 {
		keptInfo = p.GetDetails()[info]
		if detailSize(keptInfo) > room {
			keptInfo = causeInfoOf(ei, cause)
		}
		if size := detailSize(keptInfo); size <= room {
			room -= size
		} else {
			keptInfo = nil
		}
	}
	for i, d := range p.GetDetails() {
		switch {
		case i == deciding:
			details = append(details, kept)
		case i == retry:
			details = append(details, keptRetry)
		case i == info:
			if keptInfo != nil {
				details = append(details, keptInfo)
			}
		case info >= 0 && keptInfo == nil && i > info && givesCause(d):
			// The ErrorInfo read for the cause did not fit: a later one
			// that gives entries would be read in its place, a cause err
			// never had. The bound may lose the cause, never swap it.
		default:
			if size := detailSize(d); size <= room {
				room -= size
				details = append(details, d)
			}
		}
	}
	code := p.GetCode()
	if code == int32(codes.OK) {
		code = int32(codes.Unknown)
	}
	bounded := grpcstatus.ErrorProto(&spb.Status{Code: code, Message: msg, Details: details})
	if inspect(err).withoutEffect {
		return WithoutEffect(bounded) // what HandlerOutcome reads of err
	}
	return bounded
}

// decidingDetail is the index of the detail of a status that OutcomeOf
// classifies it by (the first that decodes as a tollgate OutcomeDetail, as
// grpc-go's Status.Details decodes it), and that detail decoded, or -1 when
// there is none.
func decidingDetail(details []*anypb.Any) (int, *tollgatev1.OutcomeDetail) {
	for i, d := range details {
		if typeURLPrefix+string(d.MessageName()) != outcomeDetailURL {
			continue
		}
		if m, err := d.UnmarshalNew(); err == nil {
			if od, ok := m.(*tollgatev1.OutcomeDetail); ok {
				return i, od
			}
		}
	}
	return -1, nil
}

// retryDetail is the index of the google.rpc.RetryInfo of a status that
// RetryAfter reads (the first that decodes, as grpc-go's Status.Details
// decodes it, with a valid positive delay), and that delay, or -1 when
// there is none.
func retryDetail(details []*anypb.Any) (int, *durationpb.Duration) {
	for i, d := range details {
		if typeURLPrefix+string(d.MessageName()) != retryInfoURL {
			continue
		}
		if m, err := d.UnmarshalNew(); err == nil {
			if ri, ok := m.(*errdetails.RetryInfo); ok {
				if rd := ri.GetRetryDelay(); rd.IsValid() && rd.AsDuration() > 0 {
					return i, rd
				}
			}
		}
	}
	return -1, nil
}

// causeDetail is the index of the google.rpc.ErrorInfo of a status that an
// outcome rebuilt from it takes its cause_ entries from (carriedDetails: the
// first that decodes and gives entries), that ErrorInfo decoded and its
// entries, or -1 when there is none.
func causeDetail(details []*anypb.Any) (int, *errdetails.ErrorInfo, map[string]string) {
	for i, d := range details {
		if typeURLPrefix+string(d.MessageName()) != errorInfoURL {
			continue
		}
		ei := new(errdetails.ErrorInfo)
		if proto.Unmarshal(d.GetValue(), ei) != nil {
			continue
		}
		if cause := causeOf(ei); cause != nil {
			return i, ei, cause
		}
	}
	return -1, nil, nil
}

// givesCause reports whether detail d is a google.rpc.ErrorInfo that
// decodes and gives cause_ entries (causeOf): one carriedDetails would read
// if none before it did.
func givesCause(d *anypb.Any) bool {
	if typeURLPrefix+string(d.MessageName()) != errorInfoURL {
		return false
	}
	var ei errdetails.ErrorInfo
	return proto.Unmarshal(d.GetValue(), &ei) == nil && causeOf(&ei) != nil
}

// causeInfoOf is ei, an ErrorInfo whose entries (causeOf) are cause, rebuilt
// by what an outcome reads of it, under the standard type URL: its domain
// and reason, and the metadata entries that gave cause, so that causeOf
// gives the same entries from it (each entry it took from ei it takes
// again, with as much room left as when it did; those it skipped are gone).
// What Bounded keeps of one too large for the room it has.
func causeInfoOf(ei *errdetails.ErrorInfo, cause map[string]string) *anypb.Any {
	md := make(map[string]string, len(cause))
	for k, v := range cause {
		if ei.GetDomain() != Domain {
			// Another domain's: cause_domain and cause_reason are its domain
			// and reason, cause_md_ entries its metadata.
			var ok bool
			if k, ok = strings.CutPrefix(k, causeMetadataKey); !ok {
				continue
			}
		}
		md[k] = v
	}
	a, err := anypb.New(&errdetails.ErrorInfo{Domain: ei.GetDomain(), Reason: ei.GetReason(), Metadata: md})
	if err != nil { // cannot happen: an ErrorInfo always marshals
		return &anypb.Any{TypeUrl: errorInfoURL}
	}
	return a
}

// retryInfoOf is a RetryInfo of delay d alone, under the standard type URL:
// what Bounded keeps of one that carries more (unknown fields, a long type
// URL).
func retryInfoOf(d *durationpb.Duration) *anypb.Any {
	a, err := anypb.New(&errdetails.RetryInfo{RetryDelay: &durationpb.Duration{Seconds: d.GetSeconds(), Nanos: d.GetNanos()}})
	if err != nil { // cannot happen: a RetryInfo always marshals
		return &anypb.Any{TypeUrl: retryInfoURL}
	}
	return a
}

// maxDetailString bounds the class an OutcomeDetail names, as an Error
// builds it (Fields.Class) and as a peer's is read (boundDetail): a class
// name is far shorter.
const maxDetailString = 256

// maxAttemptIDBytes and maxCallBytes bound an attempt ID and a call key as
// the tollgate header bounds them (DESIGN.md §2.1: 64 and 128 characters of
// [A-Za-z0-9._:-]), in an OutcomeDetail an Error builds (Fields) or a peer
// sent (boundDetail): no tollgate peer sends a longer one, and a hostile or
// broken peer's megabyte string would otherwise be copied by every reading
// of its error, and put on the client's span.
const (
	maxAttemptIDBytes = 64
	maxCallBytes      = 128
)

// droppedIdentifier stands for an attempt ID or call key longer than its
// bound (bound). It is not an identifier (its one character is
// outside the header's charset), so it names no attempt or call, and it
// compares unequal to every identifier and to "" as the long string did:
// whatever compares a detail's identifiers (does the refusal name the
// call's own attempt? its call and try?) reads the same. A cut identifier
// would name another.
const droppedIdentifier = "…"

// bound is s, repaired as validUTF8 repairs it, or dropped when s is
// longer than limit bytes, before or after the repair (which may lengthen
// it: the reader sees the repaired string): droppedIdentifier for an
// attempt ID or call key, "" for a class.
func bound(s string, limit int, dropped string) string {
	if len(s) > limit {
		return dropped
	}
	if s = validUTF8(s); len(s) > limit {
		return dropped
	}
	return s
}

// boundDetail bounds the strings of d, a detail decoded from a status (a
// peer's), in place: its attempt ID and call key by bound, and
// its class dropped when longer than maxDetailString, as Fields bounds an
// Error's. It returns d.
func boundDetail(d *tollgatev1.OutcomeDetail) *tollgatev1.OutcomeDetail {
	d.AttemptId = bound(d.GetAttemptId(), maxAttemptIDBytes, droppedIdentifier)
	d.Call = bound(d.GetCall(), maxCallBytes, droppedIdentifier)
	if len(d.GetWorkloadClass()) > maxDetailString {
		d.WorkloadClass = ""
	}
	return d
}

// boundedOutcomeDetail is d, a deciding OutcomeDetail larger than
// maxCarriedBytes, less the RetryInfo Bounded keeps, as it was sent, rebuilt by what it says: its outcome,
// reason, final flag, try, retry_after, units and fence kept, its strings
// as OutcomeOf reads them (boundDetail: an attempt ID or call key beyond
// the header's bound replaced by droppedIdentifier, since a cut identifier
// would name another; a class beyond maxDetailString dropped), its unknown
// fields dropped, under the standard type URL. It is well within the bound.
func boundedOutcomeDetail(d *tollgatev1.OutcomeDetail) *anypb.Any {
	m := &tollgatev1.OutcomeDetail{Outcome: d.GetOutcome(), Reason: d.GetReason(), Try: d.GetTry(),
		UnitsRemaining: d.GetUnitsRemaining(), Final: d.GetFinal(), FencedThroughTry: d.GetFencedThroughTry(),
		AttemptId: d.GetAttemptId(), Call: d.GetCall(), WorkloadClass: d.GetWorkloadClass()}
	if ra := d.GetRetryAfter(); ra != nil {
		m.RetryAfter = &durationpb.Duration{Seconds: ra.GetSeconds(), Nanos: ra.GetNanos()}
	}
	a, err := anypb.New(boundDetail(m))
	if err != nil { // cannot happen: the strings decoded as valid UTF-8
		return &anypb.Any{TypeUrl: outcomeDetailURL}
	}
	return a
}

// detailSize is the size of detail d in a google.rpc.Status as it is sent:
// its encoded Any (type URL and value, each with its tag and length, and
// any unknown fields) with the tag and length that frame it in the status.
// Counting the framing too keeps many tiny details within the bound that
// counts them (an empty Any still takes 2 bytes).
func detailSize(d *anypb.Any) int {
	return protowire.SizeTag(statusDetailsField) + protowire.SizeBytes(proto.Size(d))
}

// statusDetailsField is the field number of google.rpc.Status's details.
const statusDetailsField = 3

// carriedDetails returns the details of err's status that an outcome
// carries after its own (a callee's BadRequest, QuotaFailure, DebugInfo, a
// handler's own detail…), in their order: every detail but a tollgate
// OutcomeDetail, which describes another call, or the same call as an
// earlier, now superseded, reading; a RetryInfo, since a status carries at
// most one and tollgate's retry guidance is authoritative; an ErrorInfo, of
// which a status carries one (AIP-193), tollgate's; and a detail that does
// not fit in what remains of maxCarriedBytes. cause is the metadata
// tollgate's ErrorInfo takes in instead: the first other domain's
// ErrorInfo's domain, reason and metadata, or what a tollgate ErrorInfo
// carried of its own cause (so that it survives every hop), bounded by
// maxCauseBytes, and nil when there is neither.
func carriedDetails(err error) (others []*anypb.Any, cause map[string]string) {
	st, ok := grpcstatus.FromError(err)
	if !ok || st == nil {
		return nil, nil
	}
	room := maxCarriedBytes
	for _, d := range st.Proto().GetDetails() {
		// By the name after the type URL's last '/', as readers resolve it:
		// another prefix names the same type.
		switch typeURLPrefix + string(d.MessageName()) {
		case outcomeDetailURL, retryInfoURL:
			continue
		case errorInfoURL:
			var ei errdetails.ErrorInfo
			if proto.Unmarshal(d.GetValue(), &ei) != nil {
				continue // not an ErrorInfo any reader could use
			}
			if cause == nil {
				cause = causeOf(&ei)
			}
			continue
		}
		if size := detailSize(d); size <= room {
			room -= size
			others = append(others, d)
		}
	}
	return others, cause
}

// causeOf is the metadata tollgate's ErrorInfo takes from ei (carriedDetails):
// the domain and reason first, then the entries in the order of their keys,
// each while it fits in maxCauseBytes, so that the same ErrorInfo gives the
// same entries at every hop.
func causeOf(ei *errdetails.ErrorInfo) map[string]string {
	var m map[string]string
	room := maxCauseBytes
	add := func(k, v string) {
		if len(k)+len(v) > room || !metadataKey(k) {
			return
		}
		if m == nil {
			m = make(map[string]string)
		}
		room -= len(k) + len(v)
		m[k] = v
	}
	md := ei.GetMetadata()
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if ei.GetDomain() == Domain {
		// Its own cause, from further below: its domain and reason first.
		for _, k := range []string{causeDomainKey, causeReasonKey} {
			if v, ok := md[k]; ok {
				add(k, v)
			}
		}
		for _, k := range keys {
			if strings.HasPrefix(k, "cause_") && k != causeDomainKey && k != causeReasonKey {
				add(k, md[k])
			}
		}
		return m
	}
	add(causeDomainKey, ei.GetDomain())
	add(causeReasonKey, ei.GetReason())
	for _, k := range keys {
		add(causeMetadataKey+k, md[k])
	}
	return m
}

// metadataKey reports whether k may name an entry of an ErrorInfo's
// metadata: AIP-193 wants [a-z][a-zA-Z0-9-_]+, at most 64 characters. A
// carried entry whose key, with the cause_md_ prefix, would not be one is
// dropped.
func metadataKey(k string) bool {
	if len(k) < 2 || len(k) > 64 || k[0] < 'a' || k[0] > 'z' {
		return false
	}
	for i := 1; i < len(k); i++ {
		switch c := k[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// errorInfoWith is e's ErrorInfo with metadata md.
func (e *Error) errorInfoWith(md map[string]string) *anypb.Any {
	ei, err := anypb.New(&errdetails.ErrorInfo{Reason: infoOf(e.reason).name, Domain: Domain, Metadata: md})
	if err != nil {
		return infoOf(e.reason).errorInfo // strings a proto decoded: cannot happen
	}
	return ei
}

// unknownCode is the code an UNKNOWN outcome carries for an underlying code c.
func unknownCode(c codes.Code) codes.Code {
	switch {
	case c == codes.OK, c == codes.Unavailable, c == codes.ResourceExhausted, c > codes.Unauthenticated:
		return codes.Unknown
	}
	return c
}

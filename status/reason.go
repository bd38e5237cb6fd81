package status

import (
	"strings"

	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"
)

// Reason names why a call was refused or why its outcome is what it is. It is
// the wire enum tollgate.v1.Reason; the constants below spare callers the
// generated names. Values may be added to the enum, never renumbered; a value
// this build does not know is carried as it is and named "UNSPECIFIED".
type Reason = tollgatev1.Reason

// The reasons of the wire contract (DESIGN.md §2.4).
const (
	ReasonUnspecified            = tollgatev1.Reason_REASON_UNSPECIFIED
	ReasonQueueFull              = tollgatev1.Reason_REASON_QUEUE_FULL
	ReasonConcurrencyFull        = tollgatev1.Reason_REASON_CONCURRENCY_FULL
	ReasonDeadlineUnreachable    = tollgatev1.Reason_REASON_DEADLINE_UNREACHABLE
	ReasonDeadlineExpired        = tollgatev1.Reason_REASON_DEADLINE_EXPIRED
	ReasonShed                   = tollgatev1.Reason_REASON_SHED
	ReasonTenantLimit            = tollgatev1.Reason_REASON_TENANT_LIMIT
	ReasonAllowanceExhausted     = tollgatev1.Reason_REASON_ALLOWANCE_EXHAUSTED
	ReasonRetryBudgetExhausted   = tollgatev1.Reason_REASON_RETRY_BUDGET_EXHAUSTED
	ReasonAttemptInProgress      = tollgatev1.Reason_REASON_ATTEMPT_IN_PROGRESS
	ReasonAttemptFenced          = tollgatev1.Reason_REASON_ATTEMPT_FENCED
	ReasonDraining               = tollgatev1.Reason_REASON_DRAINING
	ReasonStoreUnavailable       = tollgatev1.Reason_REASON_STORE_UNAVAILABLE
	ReasonRequestTooLarge        = tollgatev1.Reason_REASON_REQUEST_TOO_LARGE
	ReasonCallLost               = tollgatev1.Reason_REASON_CALL_LOST
	ReasonNotSent                = tollgatev1.Reason_REASON_NOT_SENT
	ReasonAttemptRequestMismatch = tollgatev1.Reason_REASON_ATTEMPT_REQUEST_MISMATCH
	ReasonAttemptUnverifiable    = tollgatev1.Reason_REASON_ATTEMPT_UNVERIFIABLE
	ReasonResponseNotRetained    = tollgatev1.Reason_REASON_RESPONSE_NOT_RETAINED
	ReasonMalformedHeader        = tollgatev1.Reason_REASON_MALFORMED_HEADER
	ReasonCallKeyRequired        = tollgatev1.Reason_REASON_CALL_KEY_REQUIRED
)

// Domain is the google.rpc.ErrorInfo domain of every tollgate error.
const Domain = "tollgate.dev"

// reasonInfo is what can be computed once per reason.
type reasonInfo struct {
	name      string     // "QUEUE_FULL"
	message   string     // "tollgate: not admitted: queue full", a NOT_ADMITTED refusal's message
	code      codes.Code // the code a NOT_ADMITTED refusal with this reason carries
	errorInfo *anypb.Any // google.rpc.ErrorInfo{Reason: name, Domain: Domain}, marshalled once
}

var reasons = func() []reasonInfo {
	n := 0
	for v := range tollgatev1.Reason_name {
		n = max(n, int(v)+1)
	}
	infos := make([]reasonInfo, n)
	for v, full := range tollgatev1.Reason_name {
		name := strings.TrimPrefix(full, "REASON_")
		ei, err := anypb.New(&errdetails.ErrorInfo{Reason: name, Domain: Domain})
		if err != nil {
			panic("status: marshal ErrorInfo: " + err.Error())
		}
		infos[v] = reasonInfo{
			name:      name,
			message:   "tollgate: not admitted: " + strings.ToLower(strings.ReplaceAll(name, "_", " ")),
			code:      notAdmittedCode(tollgatev1.Reason(v)),
			errorInfo: ei,
		}
	}
	for i := range infos {
		if infos[i].errorInfo == nil { // a gap in the enum's numbers
			infos[i] = infos[ReasonUnspecified]
		}
	}
	return infos
}()

// notAdmittedCode is the gRPC code of a NOT_ADMITTED refusal (DESIGN.md §2.5).
func notAdmittedCode(r Reason) codes.Code {
	switch r {
	case ReasonDraining, ReasonStoreUnavailable, ReasonNotSent, ReasonAttemptUnverifiable:
		return codes.Unavailable
	case ReasonMalformedHeader, ReasonCallKeyRequired, ReasonAttemptRequestMismatch:
		return codes.InvalidArgument
	default:
		return codes.ResourceExhausted
	}
}

// infoOf returns the precomputed data of r; values this build does not know
// share REASON_UNSPECIFIED's.
func infoOf(r Reason) *reasonInfo {
	if r >= 0 && int(r) < len(reasons) {
		return &reasons[r]
	}
	return &reasons[ReasonUnspecified]
}

// ReasonName returns the reason's name without the REASON_ prefix, as the
// ErrorInfo reason carries it ("QUEUE_FULL"). Unknown values give "UNSPECIFIED".
func ReasonName(r Reason) string { return infoOf(r).name }

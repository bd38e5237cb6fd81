package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"
)

// Store keeps the records of the calls a server ran, so that each record key
// runs its handler at most once while the record is retained (DESIGN.md §3.7)
// and absence is answered honestly (§3.8). Implementations are safe for
// concurrent use; every method honours ctx's deadline and cancellation.
//
// Faults of the store itself (unreachable, too slow, full, too few replicas)
// are errors that match [ErrStoreUnavailable] (errors.Is); a full store's
// wrap [ErrStoreFull], which matches it. The interceptor answers them NOT_ADMITTED
// STORE_UNAVAILABLE, except a [*TooLittleTimeError] (the try's time left
// cannot fit the store's work), which it answers NOT_ADMITTED
// DEADLINE_UNREACHABLE. Malformed input is an error matching [ErrMalformedKey].
// Everything else — a try that may not start — is not an error but a
// [BeginResult] with a [Refusal].
type Store interface {
	// Begin starts a try atomically, or returns the record that stops it.
	// On success the record is IN_PROGRESS with a lease until req.Deadline
	// plus the store's clock skew, and BeginResult.Started is true.
	Begin(ctx context.Context, req BeginRequest) (BeginResult, error)
	// Finish records how a started try ended. It fails with an error
	// wrapping [ErrNotRunning] when the try is not the record's running try
	// (its lease ran out, it began with another fingerprint, or the store
	// lost it), and changes nothing then.
	Finish(ctx context.Context, req FinishRequest) error
	// Get returns the record of a call without changing it: UNSEEN when it is
	// absent and the store can vouch that it would hold it, UNKNOWN when the
	// attempt lies outside the horizon. The record is the caller's to keep.
	Get(ctx context.Context, key Key) (*tollgatev1.AttemptRecord, error)
	// Fence makes sure no try numbered throughTry or lower ever starts: an
	// absent record inside the horizon becomes the tombstone
	// FENCED(throughTry) atomically, and a tombstone is raised to throughTry
	// (never lowered). Any other record (IN_PROGRESS, ABANDONED, SUCCEEDED,
	// FAILED, UNKNOWN) is returned as it is, and an attempt outside the
	// horizon reads UNKNOWN. The record is the caller's to keep.
	Fence(ctx context.Context, key Key, throughTry uint32) (*tollgatev1.AttemptRecord, error)
}

// BeginRequest describes the try a server is about to run.
type BeginRequest struct {
	// Key names the call's record.
	Key Key
	// Try is the try's number, 1–1000.
	Try uint32
	// Fingerprint is [Fingerprint] of the method and the request bytes.
	Fingerprint Digest
	// Deadline is the attempt's deadline d (the header's "d", capped by the
	// server). The try may start only until Deadline plus the store's skew,
	// and its lease lasts exactly that long. Required, between 1970 and the
	// year 9000 (ErrMalformedKey otherwise).
	Deadline time.Time
	// Minted says that the serving server minted the attempt itself, for
	// this very request (its caller sent no tollgate header, or is a peer
	// it does not trust): no try of the attempt can have been sent
	// anywhere before this one, so the absence of its record is evidence
	// whatever the store's horizon. The store then skips the one
	// condition ts − Skew ≥ horizon (DESIGN.md §3.8), which would refuse
	// every request for the first Skew after the store began retaining
	// (and the memory store its like for records a clock stepped forward
	// swept: see [MemoryStore]); every other check stays (ts ≤ now + Skew, no record can have
	// expired, the deadline plus Skew, fingerprints, capacity). Never set
	// it for an attempt that came from a caller: after a restart or
	// failover, a repeat of such an attempt would run again.
	Minted bool
}

// Refusal says why [Store.Begin] did not start a try. Its zero value,
// NotRefused, goes with BeginResult.Started.
type Refusal uint8

const (
	// NotRefused: the try started.
	NotRefused Refusal = iota
	// RefusedFinished: a try of the call finished; the record (SUCCEEDED,
	// FAILED or UNKNOWN) answers every try, whatever its number.
	RefusedFinished
	// RefusedInProgress: a try of the call is running and its lease has not
	// run out (ATTEMPT_IN_PROGRESS).
	RefusedInProgress
	// RefusedAbandoned: a try's lease ran out before it finished; its effect
	// is unknown and no try of the call will ever run again.
	RefusedAbandoned
	// RefusedFenced: the record is a tombstone FENCED(n) with n ≥ the try's
	// number (ATTEMPT_FENCED; the owner continues at n+1).
	RefusedFenced
	// RefusedMismatch: the record was made with a different fingerprint
	// (ATTEMPT_REQUEST_MISMATCH); Record is the existing record.
	RefusedMismatch
	// RefusedDeadlineExpired: the try came after its deadline plus skew
	// (DEADLINE_EXPIRED). Record is nil.
	RefusedDeadlineExpired
	// RefusedUnverifiable: the attempt lies outside the store's horizon, so
	// its earlier tries may have run (ATTEMPT_UNVERIFIABLE). Record reads
	// UNKNOWN.
	RefusedUnverifiable
)

var refusalNames = [...]string{"NOT_REFUSED", "FINISHED", "IN_PROGRESS", "ABANDONED", "FENCED", "MISMATCH", "DEADLINE_EXPIRED", "UNVERIFIABLE"}

// String returns the refusal's name, for example "IN_PROGRESS", or
// "INVALID" for a value not declared here (as status.Kind's does).
func (r Refusal) String() string {
	if int(r) < len(refusalNames) {
		return refusalNames[r]
	}
	return "INVALID"
}

// BeginResult is what [Store.Begin] answers: either Started, or a Refusal
// and, except for RefusedDeadlineExpired, the Record that caused it.
type BeginResult struct {
	// Started is true when the try began; Record is nil then.
	Started bool
	// Refusal says why the try did not start.
	Refusal Refusal
	// Record is the record that stopped the try. It is the caller's to keep.
	Record *tollgatev1.AttemptRecord
	// VerifiableFrom is set, with RefusedUnverifiable, when the try was
	// refused because the store began retaining records (its
	// horizon: a restart, a failover, a flush, or on Redis the tenant's
	// first request) less than Skew before the attempt was created, or
	// after it: it is horizon + Skew, the creation time from which a new
	// attempt would be inside the horizon. It is set too when the memory
	// store swept the record of an attempt created no earlier than this
	// one by a clock stepped forward and since corrected (see
	// [MemoryStore]), or dropped it in [MemoryStore.Reset], and so refuses
	// a new attempt created now too, whatever this one's age: the creation
	// time after the newest such attempt. Zero otherwise, as for an
	// attempt refused for its age alone (an ordinary expiry).
	VerifiableFrom time.Time
}

// FinishRequest records how a started try ended (DESIGN.md §3.7).
type FinishRequest struct {
	// Key names the call's record.
	Key Key
	// Try is the number of the try that ended; it must be the record's
	// running try.
	Try uint32
	// Fingerprint must equal the one the try began with.
	Fingerprint Digest
	// State is how the try ended: SUCCEEDED, FAILED (a definite error),
	// FENCED (a try without effect: the record becomes the tombstone
	// FENCED(Try)) or UNKNOWN (anything else).
	State tollgatev1.AttemptState
	// Response is the serialized response of a SUCCEEDED unary try. A
	// response longer than the policy's MaxResponseBytes, or one that the
	// store has no room for, is not kept: the record is SUCCEEDED with
	// response_retained false. The store copies it.
	Response []byte
	// Withheld says a SUCCEEDED try has no response to keep (a stream's, or
	// one that could not be serialized): the record reads
	// response_retained false, so no one mistakes an empty one for it.
	Withheld bool
	// Minted repeats the BeginRequest.Minted of the try's Begin: a store
	// that checks the horizon when finishing (idempotency/redisstore)
	// skips ts − Skew ≥ horizon for it as Begin did.
	Minted bool
	// Code is the status code a FAILED or UNKNOWN try ended with; not OK.
	// Ignored for other states.
	Code codes.Code
	// Message is the status message a FAILED or UNKNOWN try ended with.
	Message string
	// Details are the status details a FAILED or UNKNOWN try ended with. The
	// store keeps them as given: do not modify them afterwards.
	Details []*anypb.Any
	// UnitsSpent is the allowance units this try spent below the server; the
	// record adds them to the call's cumulative units_spent.
	UnitsSpent int64
}

func (r *FinishRequest) validate() error {
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if err := validTry(r.Try); err != nil {
		return err
	}
	switch r.State {
	case tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED:
	case tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN:
		if r.Code == codes.OK {
			return fmt.Errorf("%w: a %s try needs a status code other than OK", errMalformedRequest, r.State)
		}
	default:
		return fmt.Errorf("%w: a try cannot finish as %s", errMalformedRequest, r.State)
	}
	if r.UnitsSpent < 0 {
		return fmt.Errorf("%w: units_spent must not be negative", errMalformedRequest)
	}
	return nil
}

func (r *BeginRequest) validate() error {
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if err := validTry(r.Try); err != nil {
		return err
	}
	if r.Deadline.IsZero() {
		return fmt.Errorf("%w: begin needs the attempt's deadline", errMalformedRequest)
	}
	if r.Deadline.Before(time.Unix(0, 0)) || r.Deadline.After(latestDeadline) {
		// A record's times (its lease is the deadline plus the skew) must
		// be ones every store can keep and a protobuf Timestamp can carry.
		return fmt.Errorf("%w: the deadline %v is not between 1970 and %d", errMalformedRequest, r.Deadline, latestDeadline.Year())
	}
	return nil
}

// latestDeadline is the latest attempt deadline a try may begin with: far
// past any real attempt, and far enough before the year 9999 (the last a
// protobuf Timestamp holds) for any skew, grace and retention after it.
var latestDeadline = time.Date(9000, time.January, 1, 0, 0, 0, 0, time.UTC)

// ValidateBegin reports whether req is well formed; the error matches
// [ErrMalformedKey] (errors.Is). Stores call it before doing anything.
func ValidateBegin(req BeginRequest) error { return req.validate() }

// ValidateFinish reports whether req is well formed; the error matches
// [ErrMalformedKey] (errors.Is). Stores call it before doing anything.
func ValidateFinish(req FinishRequest) error { return req.validate() }

// ValidateFence reports whether a fence through throughTry of key is well
// formed; the error wraps [ErrMalformedKey].
func ValidateFence(key Key, throughTry uint32) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if throughTry < 1 || throughTry > MaxTry {
		return fmt.Errorf("%w: fence_through_try must be 1–%d, not %d", ErrMalformedKey, MaxTry, throughTry)
	}
	return nil
}

// Errors of stores. Compare with errors.Is: stores wrap them with detail.
var (
	// ErrStoreUnavailable: the store could not answer (unreachable, too
	// slow for the context, too few replicas acknowledged, or full).
	ErrStoreUnavailable = errors.New("idempotency: store unavailable")
	// ErrStoreFull: the store holds as many records or bytes as it may and
	// refuses new ones rather than evicting any. It matches
	// ErrStoreUnavailable too (errors.Is(ErrStoreFull, ErrStoreUnavailable)
	// holds), so an error that wraps it need not wrap both.
	ErrStoreFull error = storeFullError{}
	// ErrTooLittleTime: the call's context has too little time left for
	// the store to do its work in (a store that waits for replicas needs
	// time for the wait), so it sent nothing and changed no record. Stores
	// return it as a [*TooLittleTimeError], which also matches
	// ErrStoreUnavailable. A server refuses the try NOT_ADMITTED
	// DEADLINE_UNREACHABLE, as admission refuses a try that cannot fit its
	// service time; the AttemptService answers DEADLINE_EXCEEDED.
	ErrTooLittleTime = errors.New("idempotency: too little time left for the store")
	// ErrNotRunning: [Store.Finish] named a try that is not the record's
	// running try: its lease ran out (the record reads ABANDONED), it
	// already finished, another try runs, the running try began with
	// another request fingerprint than the Finish names, or the store lost
	// it. The try's outcome stays unknown to its caller.
	ErrNotRunning = errors.New("idempotency: try is not running")
)

// ErrInvalidOption is wrapped by every error of a store's or service's
// configuration: an invalid option of [NewMemoryStore] (its Replicas
// included) or of idempotency/redisstore's New, and an invalid [Policy]
// ([Policy.Validate]). Compare with errors.Is. A Redis server that New
// refuses (its maxmemory-policy, its identity, its hz) is not an invalid
// option, and its error does not wrap it.
var ErrInvalidOption = errors.New("idempotency: invalid option")

// invalid is a configuration error wrapping ErrInvalidOption: "idempotency:
// invalid option: " and format's text.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// storeFullError is ErrStoreFull: it reads "idempotency: store full" and
// matches ErrStoreUnavailable too.
type storeFullError struct{}

func (storeFullError) Error() string        { return "idempotency: store full" }
func (storeFullError) Is(target error) bool { return target == ErrStoreUnavailable }

// errMalformedRequest is wrapped by the errors of a request malformed in
// other parts than its key and try (a finish's state or status code, a
// begin's deadline): it reads "idempotency: malformed request" and matches
// ErrMalformedKey, as every malformed input does.
var errMalformedRequest error = malformedRequestError{}

type malformedRequestError struct{}

func (malformedRequestError) Error() string        { return "idempotency: malformed request" }
func (malformedRequestError) Is(target error) bool { return target == ErrMalformedKey }

// TooLittleTimeError is the error of a store call whose context had too
// little time left for the store's work: the store sent nothing and changed
// no record. errors.Is matches it with [ErrTooLittleTime] and
// [ErrStoreUnavailable].
type TooLittleTimeError struct {
	// Left is the time the call's context had left.
	Left time.Duration
	// Needed is the least time the store needs: a call given less fails
	// the same way.
	Needed time.Duration
	// Why says what the time is needed for.
	Why string
}

// Error says how much time was left and how much the store needed, and why.
func (e *TooLittleTimeError) Error() string {
	return fmt.Sprintf("%v: %v left, at least %v needed (%s)", ErrTooLittleTime, e.Left.Round(time.Millisecond), e.Needed, e.Why)
}

// Is reports whether target is ErrTooLittleTime or ErrStoreUnavailable.
func (e *TooLittleTimeError) Is(target error) bool {
	return target == ErrTooLittleTime || target == ErrStoreUnavailable
}

// Policy fixes the times every store works with. Build one with
// [DefaultPolicy] and change fields; stores validate it at construction.
type Policy struct {
	// Skew is the largest clock difference assumed between trusted peers
	// (DESIGN.md §3.1). Default 500 ms; at most [MaxSkew] (1 min).
	Skew time.Duration
	// Grace is how long after d + Skew the owner may still resolve a call
	// (§3.1). Default 1 s.
	Grace time.Duration
	// MaxAttemptDeadline is the longest attempt deadline the server accepts,
	// counted from when a try arrives. Default 2 min.
	MaxAttemptDeadline time.Duration
	// TTL is how long a record lives after its last write; it must be at
	// least MaxAttemptDeadline + Skew + Grace. A record whose try's
	// deadline d lies further ahead lives until d + Skew + Grace. Default
	// 5 min.
	TTL time.Duration
	// MaxResponseBytes is the largest response kept in a SUCCEEDED record;
	// a larger one is recorded with response_retained false. 0 keeps no
	// response. Default 64 KiB.
	MaxResponseBytes int
}

// DefaultPolicy returns the default policy (see [Policy]'s fields).
func DefaultPolicy() Policy {
	return Policy{
		Skew:               500 * time.Millisecond,
		Grace:              time.Second,
		MaxAttemptDeadline: 2 * time.Minute,
		TTL:                5 * time.Minute,
		MaxResponseBytes:   64 << 10,
	}
}

// MaxSkew is the largest Policy.Skew a store accepts: the largest clock skew
// tollgate's server interceptor accepts (interceptor.WithClockSkew), which
// must equal its store's.
const MaxSkew = time.Minute

// Validate reports whether the policy is usable: no negative durations, a
// Skew of at most [MaxSkew], a positive MaxAttemptDeadline and a TTL of at
// least MaxAttemptDeadline + Skew + Grace. Its error wraps
// [ErrInvalidOption].
func (p Policy) Validate() error {
	switch {
	case p.Skew < 0 || p.Grace < 0:
		return invalid("policy skew and grace must not be negative")
	case p.Skew > MaxSkew:
		return invalid("policy skew %v is more than %v, the most tollgate's server interceptor accepts (its WithClockSkew must equal the store's)", p.Skew, MaxSkew)
	case p.MaxAttemptDeadline <= 0:
		return invalid("policy MaxAttemptDeadline must be positive")
	case p.MaxResponseBytes < 0:
		return invalid("policy MaxResponseBytes must not be negative")
	case p.TTL < p.MaxAttemptDeadline+p.Skew+p.Grace:
		return invalid("policy TTL %v is shorter than MaxAttemptDeadline + Skew + Grace (%v)",
			p.TTL, p.MaxAttemptDeadline+p.Skew+p.Grace)
	}
	return nil
}

// Vouches reports whether a store whose horizon is horizon may treat the
// absence of a record of attemptID as evidence at now (DESIGN.md §3.8): the
// ID must be a UUIDv7 whose time ts satisfies ts − Skew ≥ horizon and
// ts ≤ now + Skew, and now must be earlier than ts − Skew + TTL (no record
// written for the attempt can have expired yet: each is written at or after
// ts − Skew and lives at least TTL). [Store.Begin] further refuses a try
// after d + Skew.
func (p Policy) Vouches(attemptID string, horizon, now time.Time) bool {
	ts, ok := attemptMillis(attemptID)
	if !ok {
		return false
	}
	return p.inHorizon(ts, horizon.UnixMilli(), now.UnixMilli()) &&
		now.UnixMilli() < ts-p.Skew.Milliseconds()+p.TTL.Milliseconds()
}

// inHorizon reports whether an attempt created at ts (Unix ms) lies inside
// the horizon: ts − Skew ≥ horizon and ts ≤ now + Skew.
func (p Policy) inHorizon(ts, horizon, now int64) bool {
	return p.inHorizonFor(ts, horizon, now, false)
}

// inHorizonFor is inHorizon for a try's Begin: an attempt minted by the
// serving server for the request (BeginRequest.Minted) skips ts − Skew ≥
// horizon, never ts ≤ now + Skew.
func (p Policy) inHorizonFor(ts, horizon, now int64, minted bool) bool {
	skew := p.Skew.Milliseconds()
	return (minted || ts-skew >= horizon) && ts <= now+skew
}

// verifiableFrom returns, for an attempt created at ts (Unix ms) that is
// outside the horizon, horizon + Skew when the horizon is why (it was
// created less than Skew after the horizon, or before it, and not after
// now + Skew), and the zero time otherwise: BeginResult.VerifiableFrom.
func (p Policy) verifiableFrom(ts, horizon, now int64) time.Time {
	skew := p.Skew.Milliseconds()
	if ts-skew >= horizon || ts > now+skew {
		return time.Time{}
	}
	return time.UnixMilli(horizon + skew)
}

package interceptor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/internal/callkey"
	"github.com/tollgate-go/tollgate/internal/methodinfo"
	"github.com/tollgate-go/tollgate/status"
)

// Attempt describes the attempt a handler or call runs under: what tollgate's
// interceptors carry in the tollgate header across every try and tier.
type Attempt struct {
	// ID is the attempt's identity, a UUIDv7 minted by its origin.
	ID string
	// Deadline is the attempt's one deadline; no retry or layer extends it.
	Deadline time.Time
	// Tenant is the tenant the attempt runs for ("" for none).
	Tenant string
	// Call is the key of the call this handler run serves; "" at an origin
	// client.
	Call string
	// Try is the try of Call this handler run serves; 0 at an origin client.
	Try uint32
	// Origin is true when this tier minted the attempt: an origin client, or
	// a server whose caller was untrusted or did not speak tollgate.
	Origin bool
}

// attemptState is what the interceptors keep in a context for the calls made
// under an attempt: the identity, the ledger of this tier and the numbering
// of the calls it makes.
type attemptState struct {
	Attempt
	ledger *budget.Allowance
	// Exactly one of origin and run numbers the calls made under the state:
	// origin at an origin client, run in a server's handler run.
	origin *callkey.Origin
	run    *callkey.Run
	// idempotent is true in the handler of a method declared IDEMPOTENT: its
	// calls to methods with side effects must carry explicit keys.
	idempotent bool

	// Storage for ledger, origin and run, so that one allocation holds an
	// attempt's whole state.
	ledgerStore budget.Allowance
	originStore callkey.Origin
	runStore    callkey.Run
}

type attemptKey struct{}

func attemptFrom(ctx context.Context) *attemptState {
	s, _ := ctx.Value(attemptKey{}).(*attemptState)
	return s
}

// AttemptFromContext returns the attempt a handler (or a context made by
// StartAttempt) runs under, and false when there is none.
func AttemptFromContext(ctx context.Context) (Attempt, bool) {
	if s := attemptFrom(ctx); s != nil {
		return s.Attempt, true
	}
	return Attempt{}, false
}

// StartAttempt returns a context under which every call made through
// tollgate's client interceptors belongs to one new attempt, this process
// being its origin: one identity, one deadline (timeout from now, or ctx's
// deadline if earlier) and one allowance of units shared by all the calls,
// keyed 0, 1, 2, … in the order they are made. Without it, each call made
// outside a handler is an attempt of its own. The returned context also
// carries the attempt's ledger (budget.FromContext), whose Snapshot shows
// what the calls below spent. Under a handler's context it starts a new
// attempt all the same, outside the handler's: its calls carry another
// identity and are not charged to the caller's allowance, so use it there
// only for work that is not part of serving the caller (a handler's own
// calls need nothing: they belong to its attempt). units must be in [0, 1,000,000]
// and timeout in (0, 24h], as WithAttemptTimeout's; otherwise the error
// wraps ErrInvalidOption.
func StartAttempt(ctx context.Context, units int64, timeout time.Duration) (context.Context, error) {
	if units < 0 || units > maxUnitsOnWire {
		return ctx, invalid("allowance %d outside [0, %d]", units, maxUnitsOnWire)
	}
	if timeout <= 0 || timeout > maxAttemptTimeoutCap {
		return ctx, invalid("attempt timeout %v outside (0, %v]", timeout, maxAttemptTimeoutCap)
	}
	s := new(attemptState)
	s.initOrigin(ctx, time.Now(), units, timeout)
	return budget.NewContext(context.WithValue(ctx, attemptKey{}, s), s.ledger), nil
}

// deadlineIn is the deadline a call made with ctx under s works to: the
// attempt's, or ctx's when that is earlier.
func (s *attemptState) deadlineIn(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok && d.Before(s.Deadline) {
		return d
	}
	return s.Deadline
}

// initOrigin makes s a new attempt whose origin is this client.
func (s *attemptState) initOrigin(ctx context.Context, now time.Time, units int64, timeout time.Duration) {
	id := newAttemptID(now)
	deadline := now.Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	s.Attempt = Attempt{ID: id, Deadline: deadline, Origin: true}
	s.ledgerStore.Init(units, budget.AtOrigin())
	s.ledger = &s.ledgerStore
	s.origin = &s.originStore
}

// newAttemptID mints a UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, the
// version, 74 random bits. It costs one allocation, the string. It cannot
// fail: crypto/rand.Read never returns an error (since Go 1.24 a failing
// source crashes the program instead).
func newAttemptID(now time.Time) string {
	var u uuid.UUID
	_, _ = rand.Read(u[:])
	ms := uint64(now.UnixMilli())
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // RFC 9562 variant
	return u.String()
}

type callNameKey struct{}

// WithCallKey names the next calls made with ctx explicitly: inside a
// handler their key is the parent's key followed by name ("p.name"), the
// same on every re-run of the handler, so that the callee's record
// deduplicates the call across re-runs; at the origin (under StartAttempt,
// or a call made outside a handler, which is an attempt of its own) there
// is no parent call, and the key is name itself. Either way, calls named
// alike under the same parent share one key. name is 1–128 characters of
// [A-Za-z0-9_:-] with at least one non-digit; a bad name makes the call
// fail locally with MALFORMED_HEADER (check names ahead with
// ValidCallKey). A key that would grow past 128
// characters with its parent's fails so too. A handler of a method declared
// IDEMPOTENT must name every call it makes to a method not declared
// NO_SIDE_EFFECTS (DESIGN.md §2.2).
func WithCallKey(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, callNameKey{}, name)
}

// ValidCallKey reports whether WithCallKey takes name: nil, or an error
// stating the rules, so that a program can check its names when it starts
// rather than at its first call. A valid name can still fail at call time
// when its parent's key and the name together exceed 128 characters.
func ValidCallKey(name string) error {
	if err := callkey.ValidName(name); err != nil {
		return callKeyError(name, err)
	}
	return nil
}

// callKeyError restates an error of the call-key rules for the caller, in
// the words of this package's API (WithCallKey), naming the explicit name
// ("" for a numbered key). It is also the message of the local refusal.
func callKeyError(name string, err error) error {
	switch {
	case errors.Is(err, callkey.ErrBadName):
		return fmt.Errorf("interceptor: call key %q: a name must be 1-128 characters of [A-Za-z0-9_:-] with a non-digit (WithCallKey)", name)
	case errors.Is(err, callkey.ErrTooLong) && name != "":
		return fmt.Errorf("interceptor: call key %q: with its parent's key it would be longer than 128 characters", name)
	case errors.Is(err, callkey.ErrTooLong):
		return errors.New("interceptor: call key: the next key under its parent's would be longer than 128 characters")
	}
	return fmt.Errorf("interceptor: call key %q: invalid", name)
}

// callKey returns the key of the next call made under s with ctx, or a
// local refusal (final).
func (s *attemptState) callKey(ctx context.Context, level methodinfo.Level) (string, error) {
	name, named := ctx.Value(callNameKey{}).(string)
	var (
		key string
		err error
	)
	switch {
	case named && s.run != nil:
		key, err = s.run.Explicit(name)
	case named:
		key, err = s.origin.Explicit(name)
	case s.idempotent && level != methodinfo.NoSideEffects:
		// The refusal names the call it refuses (status.Fields), not the
		// handler's own: by the key its number gives it, used as any
		// locally refused call's is (keys skip, never repeat), and its
		// first try. A key too long to send names none.
		var refused status.Option = status.WithAttempt(s.ID, "", 0)
		if k, kerr := s.nextKey(); kerr == nil {
			refused = status.WithAttempt(s.ID, k, 1)
		}
		return "", status.NotAdmitted(status.ReasonCallKeyRequired, refused, unitsLeft(s),
			status.WithMessage("interceptor: the handler of an IDEMPOTENT method must name its calls to methods with side effects (interceptor.WithCallKey)"))
	default:
		key, err = s.nextKey()
	}
	if err != nil {
		// The refused call has no key it could be sent with, and the
		// handler's own call is not the one refused: the refusal names
		// the attempt only.
		return "", status.NotAdmitted(status.ReasonMalformedHeader,
			status.Fields{AttemptID: s.ID}, unitsLeft(s), status.WithMessage(callKeyError(name, err).Error()))
	}
	return key, nil
}

// nextKey returns the key of the next call made under s without an
// explicit key: the handler run's next, or the origin's.
func (s *attemptState) nextKey() (string, error) {
	if s.run != nil {
		return s.run.Next()
	}
	return s.origin.Next(), nil
}

package interceptor

import (
	"math"
	"math/rand/v2"
	"time"
)

// RetryPolicy is how the owner of a call (tollgate's client interceptor on
// that call's edge) may repeat it. Zero fields take their defaults; a
// RetryPolicy is plain data, safe to copy.
//
// Whatever the policy, a call is repeated only when its last try is known to
// have had no effect (NOT_ADMITTED and not final, a try never sent included
// unless it failed with a definite code), inside the
// attempt's deadline and allowance and the target's retry budget. A try whose
// outcome is UNKNOWN is first resolved with the callee's AttemptService (see
// the package documentation).
type RetryPolicy struct {
	// MaxTries is the most tries of one call, the first included: 1 means no
	// repeats. Default DefaultMaxTries (3); at most MaxTriesCap (10). A
	// verifying try, sent once the callee's AttemptService found a finished
	// record of a try in doubt, to have the record answer it, does not count
	// (it is sent with MaxTries 1 too): its server answers it from that
	// record and runs nothing.
	MaxTries int
	// InitialBackoff is the upper bound of the first repeat's jittered wait.
	// Default 20 ms, or MaxBackoff when that is set lower. The same waits
	// pace the polls of a record a resolution finds IN_PROGRESS: the
	// first poll after the query within InitialBackoff, doubling to
	// MaxBackoff, so with the defaults a call whose try finished may
	// learn it up to 1 s late, and with tight bounds it polls as often
	// (on one retry-budget token) until its record is finished.
	InitialBackoff time.Duration
	// MaxBackoff caps the jittered wait's upper bound. Default 1 s, or
	// InitialBackoff when that is set higher. Set both, it must not be
	// below InitialBackoff; neither may exceed 24 h.
	MaxBackoff time.Duration
	// PerTryTimeout bounds how long the client waits for one try; it never
	// extends the attempt's deadline. It is the try's grpc-timeout: a server
	// with a record store finishes a recorded try (of a method not declared
	// NO_SIDE_EFFECTS) anyway, its handler detached until the attempt's
	// deadline plus the skew, and the owner learns its outcome by querying;
	// a server without one, and any server for a NO_SIDE_EFFECTS method,
	// cancels its handler then, so a call that needs longer fails: one of a
	// method with side effects ends UNKNOWN after its one try (its state
	// cannot be queried there), and an IDEMPOTENT or NO_SIDE_EFFECTS one
	// fails every try. Default 0: the remaining time divided by the tries
	// left (the last try gets all of it), which leaves room to resolve and
	// repeat. Against servers without a store, and for NO_SIDE_EFFECTS
	// methods, set it to the attempt's timeout or more: each try then gets
	// all the time left. It does not apply to streams: a stream's try may
	// last until the attempt's deadline.
	PerTryTimeout time.Duration
}

const (
	defaultInitialBackoff = 20 * time.Millisecond
	defaultMaxBackoff     = time.Second
)

func (p *RetryPolicy) withDefaults() RetryPolicy {
	q := *p
	if q.MaxTries == 0 {
		q.MaxTries = DefaultMaxTries
	}
	// A default never contradicts the bound the caller did set.
	switch {
	case q.InitialBackoff == 0 && q.MaxBackoff == 0:
		q.InitialBackoff, q.MaxBackoff = defaultInitialBackoff, defaultMaxBackoff
	case q.InitialBackoff == 0:
		q.InitialBackoff = min(defaultInitialBackoff, q.MaxBackoff)
	case q.MaxBackoff == 0:
		q.MaxBackoff = max(defaultMaxBackoff, q.InitialBackoff)
	}
	return q
}

func (p *RetryPolicy) validate() error {
	q := p.withDefaults()
	switch {
	case q.MaxTries < 1 || q.MaxTries > MaxTriesCap:
		return invalid("retry policy: max tries %d outside [1, %d]", q.MaxTries, MaxTriesCap)
	case q.InitialBackoff < 0 || q.MaxBackoff < 0:
		return invalid("retry policy: negative backoff")
	case q.InitialBackoff > maxAttemptTimeoutCap || q.MaxBackoff > maxAttemptTimeoutCap:
		// No attempt lasts longer; and the jitter draws below the bound
		// plus one, which must not overflow.
		return invalid("retry policy: backoff over %v, the longest attempt", maxAttemptTimeoutCap)
	case q.PerTryTimeout < 0:
		return invalid("retry policy: negative per-try timeout")
	case q.MaxBackoff < q.InitialBackoff:
		return invalid("retry policy: max backoff %v below initial backoff %v", q.MaxBackoff, q.InitialBackoff)
	}
	*p = q
	return nil
}

// backoff returns the wait before try next (2, 3, …): exponential with full
// jitter, and never shorter than the peer's suggested retryAfter, which is
// itself jittered upwards by up to a fifth so that refused clients do not
// return in step.
func (p *RetryPolicy) backoff(next int, retryAfter time.Duration) time.Duration {
	ceiling := p.InitialBackoff
	for i := 2; i < next && ceiling < p.MaxBackoff; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, p.MaxBackoff)
	var wait time.Duration
	if ceiling > 0 {
		wait = rand.N(ceiling + 1)
	}
	if retryAfter > 0 {
		floor := retryAfter + rand.N(retryAfter/5+1)
		if floor < retryAfter { // a peer's huge retry-after overflowed: saturate
			floor = math.MaxInt64
		}
		wait = max(wait, floor)
	}
	return wait
}

// perTry returns how long try n may keep the client waiting, given the time
// remaining before the attempt's deadline.
func (p *RetryPolicy) perTry(n int, remaining time.Duration) time.Duration {
	if p.PerTryTimeout > 0 {
		return min(p.PerTryTimeout, remaining)
	}
	left := p.MaxTries - n + 1
	if left <= 1 {
		return remaining
	}
	return remaining / time.Duration(left)
}

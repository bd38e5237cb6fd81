package budget

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Defaults of [NewRetryBudget].
const (
	// DefaultRetryRatio is the tokens a first try earns: retries stay within
	// 10% of requests.
	DefaultRetryRatio = 0.1
	// DefaultMinRetriesPerSecond is the floor of tokens that accrue per second
	// whatever the traffic.
	DefaultMinRetriesPerSecond = 1.0
	// DefaultMaxRetryTokens caps the tokens saved up, and so the burst of
	// retries a quiet client can make at once.
	DefaultMaxRetryTokens = 10.0
)

// RetryBudget bounds the repeats a client makes towards one target, across
// all attempts: a token bucket where each retry and each resolution of an
// unknown outcome (however many polls it takes) costs one token
// ([RetryBudget.Withdraw]), each request's first try earns a fraction of one
// ([RetryBudget.Deposit]), and a floor accrues with time. Tokens are capped,
// so what counts is recent traffic. A new budget starts with its whole
// reserve (the cap, DefaultMaxRetryTokens by default).
//
// Create one with [NewRetryBudget]. The zero value has no tokens and earns
// none: it refuses every retry. A RetryBudget is safe for concurrent use; each
// method takes one uncontended mutex and allocates nothing. Time is read with
// time.Now; the …At methods take it as an argument instead (for tests), and
// a time earlier than one already seen counts as no time elapsed: the floor
// accrues again only from the latest time seen, so a clock that jumped
// ahead and back earns nothing until it passes that time again.
type RetryBudget struct {
	mu    sync.Mutex
	ratio float64
	rate  float64 // tokens per second
	max   float64
	// The bucket counts in millionths of a token (micro), so that ten
	// deposits of 0.1 make exactly one token: float64 sums of the ratio fall
	// short of a whole token and refuse the retry they paid for.
	microRatio  int64
	microMax    int64
	microTokens int64
	// frac is the part of a millionth the time floor accrued and no
	// refill has counted yet.
	frac float64
	last time.Time
}

// micro is one token in the bucket's unit.
const micro = 1_000_000

// MaxRetryTokensLimit is the largest [WithMaxRetryTokens] accepts.
const MaxRetryTokensLimit = 1e12

// RetryBudgetOption configures a budget built by [NewRetryBudget].
type RetryBudgetOption interface{ applyRetryBudget(*RetryBudget) }

type retryBudgetFunc func(*RetryBudget)

func (f retryBudgetFunc) applyRetryBudget(b *RetryBudget) { f(b) }

// WithRetryRatio sets the tokens each first try earns, the share of requests
// that may be retried: 0 to 1, default [DefaultRetryRatio]. It is kept to
// six decimal places.
func WithRetryRatio(r float64) RetryBudgetOption {
	return retryBudgetFunc(func(b *RetryBudget) { b.ratio = r })
}

// WithMinRetriesPerSecond sets the floor of tokens that accrue per second
// whatever the traffic: ≥ 0, default [DefaultMinRetriesPerSecond].
func WithMinRetriesPerSecond(n float64) RetryBudgetOption {
	return retryBudgetFunc(func(b *RetryBudget) { b.rate = n })
}

// WithMaxRetryTokens caps the tokens saved up: 1 to [MaxRetryTokensLimit],
// default [DefaultMaxRetryTokens].
func WithMaxRetryTokens(n float64) RetryBudgetOption {
	return retryBudgetFunc(func(b *RetryBudget) { b.max = n })
}

// ErrInvalidRetryBudget is wrapped by the error [NewRetryBudget] returns for
// an option out of range.
var ErrInvalidRetryBudget = errors.New("budget: invalid retry budget")

// NewRetryBudget returns a retry budget configured by opts over the defaults.
// It returns an error wrapping [ErrInvalidRetryBudget] when a value is out of
// range (or not a number).
func NewRetryBudget(opts ...RetryBudgetOption) (*RetryBudget, error) {
	b := &RetryBudget{
		ratio: DefaultRetryRatio,
		rate:  DefaultMinRetriesPerSecond,
		max:   DefaultMaxRetryTokens,
	}
	for _, o := range opts {
		if o != nil {
			o.applyRetryBudget(b)
		}
	}
	switch {
	case !(b.ratio >= 0 && b.ratio <= 1):
		return nil, fmt.Errorf("%w: retry ratio %v is not within [0, 1]", ErrInvalidRetryBudget, b.ratio)
	case !(b.rate >= 0) || math.IsInf(b.rate, 0):
		return nil, fmt.Errorf("%w: minimum retries per second %v is not finite and >= 0", ErrInvalidRetryBudget, b.rate)
	case !(b.max >= 1 && b.max <= MaxRetryTokensLimit):
		return nil, fmt.Errorf("%w: maximum retry tokens %v is not within [1, %g]", ErrInvalidRetryBudget, b.max, float64(MaxRetryTokensLimit))
	}
	b.microRatio = int64(math.Round(b.ratio * micro))
	b.microMax = int64(math.Round(b.max * micro))
	// Start with the whole reserve, as gRPC's retry throttling and
	// Finagle's retry budget do: a client that has just started, or sends
	// little, may still repeat a few calls; a storm drains it at once.
	b.microTokens = b.microMax
	return b, nil
}

// Withdraw takes one token for a retry or a resolution, and reports whether
// there was one. On false the caller must neither repeat nor query: tollgate's
// owner ends the call NOT_ADMITTED RETRY_BUDGET_EXHAUSTED with its last
// outcome, or, when a try's outcome is unknown, UNKNOWN with that reason.
func (b *RetryBudget) Withdraw() bool { return b.WithdrawAt(time.Now()) }

// WithdrawAt is [RetryBudget.Withdraw] at time now.
func (b *RetryBudget) WithdrawAt(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	if b.microTokens < micro {
		return false
	}
	b.microTokens -= micro
	return true
}

// Return gives back the token [RetryBudget.Withdraw] took for a retry that
// was never sent (the caller found, during or after its backoff, that it
// could not send it, or the retry never left the client): the budget bounds
// retries sent, not retries meant.
func (b *RetryBudget) Return() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.microTokens = min(b.microTokens+micro, b.microMax)
}

// Deposit earns the tokens of one request: call it once for each call's
// first try.
func (b *RetryBudget) Deposit() { b.DepositAt(time.Now()) }

// DepositAt is [RetryBudget.Deposit] at time now.
func (b *RetryBudget) DepositAt(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	b.microTokens = min(b.microTokens+b.microRatio, b.microMax)
}

// Tokens returns the tokens available now.
func (b *RetryBudget) Tokens() float64 { return b.TokensAt(time.Now()) }

// TokensAt returns the tokens available at time now.
func (b *RetryBudget) TokensAt(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	return float64(b.microTokens) / micro
}

func (b *RetryBudget) refillLocked(now time.Time) {
	if b.last.IsZero() {
		b.last = now
		return
	}
	if !now.After(b.last) {
		return
	}
	room := b.microMax - b.microTokens
	elapsed := now.Sub(b.last)
	b.last = now
	if b.rate == 0 || room <= 0 {
		b.frac = 0 // nothing accrues while the bucket is full
		return
	}
	// Whole millionths are added; the fraction is carried to the next
	// refill (a busy budget reads the clock every few microseconds).
	add := elapsed.Seconds()*b.rate*micro + b.frac
	if add >= float64(room) {
		b.microTokens, b.frac = b.microMax, 0
		return
	}
	whole := math.Floor(add)
	b.microTokens += int64(whole)
	b.frac = add - whole
}

// Delay returns how long from now until the budget holds a whole token from
// the time floor alone ([WithMinRetriesPerSecond]): 0 when one is available
// now. First tries' deposits may make one sooner. ok is false when no token
// is available and the floor is 0, so that only deposits can refill it. It
// changes nothing but the refill due by now. tollgate's owner suggests it as
// the retry-after of a RETRY_BUDGET_EXHAUSTED refusal.
func (b *RetryBudget) Delay() (d time.Duration, ok bool) { return b.DelayAt(time.Now()) }

// DelayAt is [RetryBudget.Delay] at time now.
func (b *RetryBudget) DelayAt(now time.Time) (d time.Duration, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	short := micro - b.microTokens
	switch {
	case short <= 0:
		return 0, true
	case b.rate == 0:
		return 0, false
	}
	secs := (float64(short) - b.frac) / (b.rate * micro)
	if secs >= float64(math.MaxInt64)/float64(time.Second) {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(math.Ceil(secs * float64(time.Second))), true
}

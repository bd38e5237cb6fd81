package admission

import "time"

// WithClock makes the controller read time from now (tests only).
func WithClock(now func() time.Time) Option { return withClock(now) }

// WithInvariantCheck calls f, under the controller's lock, after every
// change of state with the first violation of invariant 9's bounds found,
// or nil (tests only).
func WithInvariantCheck(f func(error)) Option {
	return optionFunc(func(c *config) { c.check = f })
}

// WithGoneNoted calls f each time the controller notes, from the context's
// own AfterFunc, that a waiter's context has ended while it still waits
// (tests only): from then on the next call that takes the lock takes that
// waiter out, whether or not its own goroutine has run.
func WithGoneNoted(f func()) Option {
	return optionFunc(func(c *config) { c.goneNoted = f })
}

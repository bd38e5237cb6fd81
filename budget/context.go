package budget

import (
	"context"

	"github.com/tollgate-go/tollgate/internal/ctxkey"
)

// allowanceKey is shared with the interceptors, whose handler context answers
// it without a context value of its own.
type allowanceKey = ctxkey.Allowance

type grantKey struct{}

// NewContext returns a copy of ctx that carries a, the ledger of the handler
// run the context belongs to; [FromContext] finds it. The server
// interceptor's handler contexts carry their ledger without it (they answer
// the same key); interceptor.StartAttempt and tests use it.
func NewContext(ctx context.Context, a *Allowance) context.Context {
	return context.WithValue(ctx, allowanceKey{}, a)
}

// FromContext returns the ledger ctx carries, and false when it carries none.
func FromContext(ctx context.Context) (*Allowance, bool) {
	a, ok := ctx.Value(allowanceKey{}).(*Allowance)
	return a, ok && a != nil
}

// WithGrant returns a copy of ctx whose outbound calls lend their callee at
// most units units (negative counts as 0) instead of the default grant (all
// free units but those kept for the caller's further tries). Every try of
// every call made with the context lends up to units, never more than is
// free when it is sent.
func WithGrant(ctx context.Context, units int64) context.Context {
	return context.WithValue(ctx, grantKey{}, max(units, 0))
}

// GrantFromContext returns the grant set by [WithGrant] or [Split], and false
// when ctx sets none.
func GrantFromContext(ctx context.Context) (int64, bool) {
	g, ok := ctx.Value(grantKey{}).(int64)
	return g, ok
}

// Split divides the free units of the ledger in ctx among n upcoming calls,
// for a handler that fans out: it returns n contexts, one per call, each
// carrying a grant (see [WithGrant]). Below the origin the grants leave one
// unit for each planned call's first send; the rest is shared as evenly as
// possible, the first calls getting the remainder. For example, 10 free
// units split 3 ways are grants of 3, 2 and 2 (7 units), leaving 3 units for
// the three sends. At the origin, whose own sends are not charged, all free
// units are shared: 10 split 3 ways are grants of 4, 3 and 3.
//
// Split reserves nothing: the grants are ceilings, and each call still lends
// no more than is free when it is sent, so calls made in any order, repeated,
// or beyond the n planned cannot overspend. The units left for the sends are
// not set aside either: a call's repeats take units from the same ledger (each
// try below the origin costs one), so when the calls made first repeat, a
// later call may find nothing free and be refused ALLOWANCE_EXHAUSTED
// without being sent. To give every target its try, make the calls
// concurrently, or limit the repeats of the first ones (their retry
// policy's MaxTries), or grant less. When ctx carries no ledger the
// contexts are ctx itself (default grants). n ≤ 0 returns nil. It costs one
// allocation for the slice and one per context (two for a grant over 255).
func Split(ctx context.Context, n int) []context.Context {
	if n <= 0 {
		return nil
	}
	out := make([]context.Context, n)
	a, ok := FromContext(ctx)
	if !ok {
		for i := range out {
			out[i] = ctx
		}
		return out
	}
	snap := a.Snapshot()
	sends := int64(n) // a unit for each call's own send…
	if snap.Origin {
		sends = 0 // …which the origin is not charged
	}
	share := max(snap.Free-sends, 0)
	base, extra := share/int64(n), share%int64(n)
	for i := range out {
		g := base
		if int64(i) < extra {
			g++
		}
		out[i] = WithGrant(ctx, g)
	}
	return out
}

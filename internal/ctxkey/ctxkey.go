// Package ctxkey holds the context keys that tollgate's packages share, so
// that one context value built by the interceptors can answer for several
// packages at once instead of costing an allocation per package.
package ctxkey

// Allowance is the key of the ledger a context carries: budget.NewContext
// and budget.FromContext use it, and the server interceptor's handler
// context answers it directly.
type Allowance struct{}

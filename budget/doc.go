// Package budget holds tollgate's two limits on repeated work: the
// per-attempt allowance ledger ([Allowance]) and the client-wide retry budget
// ([RetryBudget]).
//
// # The allowance
//
// An attempt has one allowance: the number of RPCs that all layers below the
// origin may send for it, across every try of every call, never reset
// (DESIGN.md §3, invariant 3). A unit is the right to send one RPC below the
// origin, taken before it is sent. The origin creates the allowance and lends
// it to the call it makes; every server builds an [Allowance] from the units
// its request was granted (header field u), takes one unit for each RPC its
// handler sends ([Allowance.Take]), and lends part of what is left to the
// callee of each RPC ([Allowance.Lend], [Allowance.LendFree]) so that the
// callee can make calls of its own. The origin's own tries are not charged:
// tollgate's client interceptor lends each of them every free unit
// ([Allowance.LendFree] keeping 0, or up to the grant [WithGrant] sets), and
// refuses a repeat only once a non-zero allowance is all spent (the refusal
// is then final) or the ledger is sealed; a repeat while units are still
// held by earlier tries is sent with what is free, possibly nothing, and
// with an allowance of 0 the origin's call repeats under its policy, unless
// the callee answers ALLOWANCE_EXHAUSTED (it needed units the origin can
// never lend): the call then ends with that refusal, final, after one try.
// Because nobody can spend what it was not lent, repeats at several layers
// add up instead of multiplying: three tries at the origin and two per call
// in the middle tier, with four units, reach the dependency four times, not
// six.
//
// Each ledger keeps its units in four piles, whose sum never changes:
//
//	free      may be taken or lent
//	reserved  lent to a callee whose call is in flight
//	held      lent to a callee whose call ended without saying what it spent
//	spent     taken for an RPC, or lent and known (or assumed) spent
//
// Every grant is tracked by a [Loan], which ends exactly once:
//
//   - [Loan.Settle] when the callee reported tollgate-spent: the unspent part
//     returns to free, the rest is spent (a report above the grant counts as
//     the grant). [Loan.Refund] returns the whole grant, on the endings that
//     DESIGN.md §2.3 allows to mean "spent nothing": in lenient accounting, a
//     call that ended with the peer's status and no trailer, OK or with a
//     definite code or with a tollgate refusal naming the call and try sent.
//   - [Loan.Hold] on any other ending (strict accounting and a completed call
//     without the trailer, a lost response, a proxy's own timeout): the grant
//     counts as spent until [Loan.Reconcile] learns, from a record finished as
//     SUCCEEDED, FAILED, FENCED or UNKNOWN, how much the call really spent.
//     [ReconcileCall] spreads a record's cumulative units_spent over the
//     loans of all of the call's tries; [ReconcileCallHeld] does the same
//     and reports how many of the units it reconciled were held.
//
// Which of these the interceptor calls is its decision: strict and lenient
// accounting differ only in which endings it maps to Refund and which to Hold.
//
// When a server answers it seals its ledger ([Allowance.Seal]): grants still
// reserved or held (a goroutine still calling) count as spent, the total is
// what it reports in tollgate-spent, and later takes are refused. A call that
// finds no free unit is refused locally with NOT_ADMITTED
// ALLOWANCE_EXHAUSTED; the refusal is final only at the origin, and only when
// spent units reach the allowance (held or reserved units may still return)
// or the ledger is sealed (none can).
//
// A fan-out handler divides its free units among its next calls with [Split],
// or sets one call's grant with [WithGrant]; the interceptor finds the
// handler's ledger with [FromContext] and the grant with [GrantFromContext].
//
// # The retry budget
//
// A [RetryBudget] bounds the repeats a client makes towards one target, across
// all attempts: each retry, and each resolution of an unknown outcome, costs a
// token (a retry never sent gives it back, [RetryBudget.Return]); each first try earns a fraction of one (by default retries stay
// within 10% of requests), and a small floor accrues over time (by default one
// token per second, up to a cap), so that a storm of failures cannot multiply
// load while an idle client can still repeat now and then.
package budget

package budget

import (
	"sync"

	"github.com/tollgate-go/tollgate/status"
)

// MaxUnits is the largest allowance a ledger holds; larger values given to
// [NewAllowance] are capped. It matches the header's limit on granted units.
const MaxUnits = 1_000_000

// Allowance is one ledger of an attempt's allowance: the units a caller may
// take for the RPCs it sends and lend to their callees (see the package
// documentation). Create one with [NewAllowance].
//
// The zero value is a non-origin ledger of 0 units: it refuses every take and
// lends nothing. An Allowance is safe for concurrent use; every method takes
// one uncontended mutex and allocates nothing, except that [Allowance.Lend]
// and [Allowance.LendFree] allocate the [Loan] of every non-empty grant after
// the ledger's first, and a refusal allocates its error.
type Allowance struct {
	mu       sync.Mutex
	total    int64
	free     int64
	reserved int64
	held     int64
	spent    int64
	origin   bool
	sealed   bool
	// first is the storage of the ledger's first Loan: most ledgers lend
	// once (one call, one try), which then allocates nothing.
	first Loan
}

// AllowanceOption configures a ledger built by [NewAllowance].
type AllowanceOption interface{ applyAllowance(*Allowance) }

type atOrigin struct{}

func (atOrigin) applyAllowance(a *Allowance) { a.origin = true }

// AtOrigin marks the ledger as the origin's, the only one whose refusals can
// be final.
func AtOrigin() AllowanceOption { return atOrigin{} }

// NewAllowance returns a ledger of units free units. Negative units count as
// 0 and units above [MaxUnits] as MaxUnits. By default the ledger is a
// server's, built from the units its request was granted; [AtOrigin] makes it
// the origin's.
func NewAllowance(units int64, opts ...AllowanceOption) *Allowance {
	a := &Allowance{}
	a.Init(units, opts...)
	return a
}

// Init readies a, a zero Allowance embedded in a larger value (to save an
// allocation per request), exactly as NewAllowance would build it. It must be
// called once, before a is shared.
func (a *Allowance) Init(units int64, opts ...AllowanceOption) {
	units = clamp(units, 0, MaxUnits)
	a.total, a.free = units, units
	for _, o := range opts {
		if o != nil {
			o.applyAllowance(a)
		}
	}
}

func clamp(v, lo, hi int64) int64 {
	return max(lo, min(v, hi))
}

// Take takes one unit for an RPC about to be sent: free → spent. It returns
// nil, or when no unit is free or the ledger is sealed a NOT_ADMITTED
// ALLOWANCE_EXHAUSTED refusal (a *status.Error) that reports the units
// remaining and is final only at the origin, once spent units reach the
// allowance or the ledger is sealed (no unit can come back then).
func (a *Allowance) Take() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.free <= 0 || a.sealed {
		return a.refusalLocked()
	}
	a.free--
	a.spent++
	return nil
}

// Check reports whether a unit is free without taking one: nil, or the
// refusal [Allowance.Take] would return. At the origin that refusal is final
// once spent units reach the allowance, which for an allowance of 0 is at
// once, or the ledger is sealed. (tollgate's client interceptor does not call it: it refuses a repeat
// of the origin's own, uncharged, tries only once a non-zero allowance is
// all spent, or the ledger is sealed.)
func (a *Allowance) Check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.free <= 0 || a.sealed {
		return a.refusalLocked()
	}
	return nil
}

func (a *Allowance) refusalLocked() error {
	// As the interceptor's originFinal: a sealed ledger gets no unit back.
	f := status.Fields{Final: a.origin && (a.spent >= a.total || a.sealed)}
	if a.sealed {
		f.Message = "budget: ledger sealed"
	} else {
		f.UnitsRemaining = a.free
	}
	return status.NotAdmitted(status.ReasonAllowanceExhausted, f)
}

// Lend reserves up to units free units for a callee (free → reserved) and
// returns the [Loan] that tracks them; the grant is smaller than asked when
// fewer units are free. A grant of 0 units — nothing free, units ≤ 0, or a
// sealed ledger — is a nil *Loan, whose methods do nothing, and costs no
// allocation. Take the unit for the RPC itself first.
func (a *Allowance) Lend(units int64) *Loan {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lendLocked(units)
}

// LendFree lends the default grant: every free unit except keep, the units
// the caller's retry policy may still need for its own further tries of the
// call (one per try). Call it after [Allowance.Take] for the try being sent.
// A grant of 0 is a nil *Loan, as with [Allowance.Lend].
func (a *Allowance) LendFree(keep int64) *Loan {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lendLocked(a.free - max(keep, 0))
}

func (a *Allowance) lendLocked(units int64) *Loan {
	units = min(units, a.free)
	if units <= 0 || a.sealed {
		return nil
	}
	a.free -= units
	a.reserved += units
	if a.first.a == nil {
		a.first = Loan{a: a, units: units, state: loanReserved}
		return &a.first
	}
	return &Loan{a: a, units: units, state: loanReserved}
}

// Seal closes the ledger when its server answers: units reserved or held
// (grants of calls that may still be spending) count as spent from now on,
// later takes and lends are refused, and later endings of its loans change
// nothing. It returns the total spent, the value of the tollgate-spent
// trailer. Sealing again returns the same total.
func (a *Allowance) Seal() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.sealed {
		a.sealed = true
		a.spent += a.reserved + a.held
		a.reserved, a.held = 0, 0
	}
	return a.spent
}

// Free returns the number of free units.
func (a *Allowance) Free() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.free
}

// Spent returns the number of spent units.
func (a *Allowance) Spent() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.spent
}

// Snapshot is a consistent view of a ledger's piles: Free + Reserved + Held +
// Spent == Total.
type Snapshot struct {
	// Total is the allowance the ledger was created with.
	Total int64
	// Free units may be taken or lent.
	Free int64
	// Reserved units are lent to calls in flight.
	Reserved int64
	// Held units are lent to calls that ended without saying what they spent.
	Held int64
	// Spent units were taken, or lent and known or assumed spent.
	Spent int64
	// Origin reports whether the ledger is the origin's.
	Origin bool
	// Sealed reports whether the ledger is sealed.
	Sealed bool
}

// Snapshot returns the ledger's piles, read at one instant.
func (a *Allowance) Snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Snapshot{
		Total: a.total, Free: a.free, Reserved: a.reserved, Held: a.held, Spent: a.spent,
		Origin: a.origin, Sealed: a.sealed,
	}
}

type loanState uint8

const (
	loanReserved loanState = iota // call in flight
	loanHeld                      // ended, spent not known
	loanClosed                    // settled or reconciled
)

// Loan tracks one grant lent by an [Allowance] to a callee. It ends exactly
// once, by [Loan.Settle], [Loan.Refund] or [Loan.Reconcile]; [Loan.Hold] may
// come before Reconcile. Each method reports whether it had an effect: a
// second ending, an ending in the wrong state, or any ending after the
// ledger was sealed does nothing and returns false, so a loan can never be
// refunded twice.
//
// A nil *Loan, and the zero Loan, are the empty grant: their methods do
// nothing. A Loan is safe for concurrent use; its methods take its ledger's
// mutex and allocate nothing. A Loan must not be copied (go vet's copylocks
// check reports a copy): a copy would end the same grant a second time.
type Loan struct {
	_     noCopy
	a     *Allowance
	units int64
	// guarded by a.mu
	state   loanState
	counted int64 // units counted spent when closed
}

// Units returns the size of the grant, the value of header field u.
func (l *Loan) Units() int64 {
	if l.empty() {
		return 0
	}
	return l.units
}

// Settle ends a call in flight whose callee reported tollgate-spent: min(spent,
// grant) units become spent, the rest returns to free. A negative report
// counts as 0.
func (l *Loan) Settle(spent int64) bool {
	if l.empty() {
		return false
	}
	l.a.mu.Lock()
	defer l.a.mu.Unlock()
	if l.state != loanReserved || l.a.sealed {
		return false
	}
	l.closeLocked(spent)
	l.a.reserved -= l.units
	return true
}

// Refund ends a call in flight on an ending that proves the callee spent
// nothing (DESIGN.md §2.3): the whole grant returns to free. It is Settle(0).
func (l *Loan) Refund() bool { return l.Settle(0) }

// Hold ends a call in flight whose spending is not known: the grant moves
// from reserved to held and counts as spent until [Loan.Reconcile].
func (l *Loan) Hold() bool {
	if l.empty() {
		return false
	}
	l.a.mu.Lock()
	defer l.a.mu.Unlock()
	if l.state != loanReserved || l.a.sealed {
		return false
	}
	l.state = loanHeld
	l.a.reserved -= l.units
	l.a.held += l.units
	return true
}

// Reconcile ends a held (or still reserved) grant from a finished record that
// says the try spent spent units: min(spent, grant) become spent, the rest
// returns to free. Call it only for a record finished as SUCCEEDED, FAILED,
// FENCED or UNKNOWN — never IN_PROGRESS, ABANDONED, or an UNKNOWN answered for
// lack of a horizon. A record's units_spent is cumulative over the call's
// tries: see [ReconcileCall].
func (l *Loan) Reconcile(spent int64) bool {
	if l.empty() {
		return false
	}
	l.a.mu.Lock()
	defer l.a.mu.Unlock()
	if l.a.sealed {
		return false
	}
	switch l.state {
	case loanReserved:
		l.a.reserved -= l.units
	case loanHeld:
		l.a.held -= l.units
	default:
		return false
	}
	l.closeLocked(spent)
	return true
}

// empty reports whether l is the empty grant: nil, or the zero Loan.
func (l *Loan) empty() bool { return l == nil || l.a == nil }

// noCopy makes go vet's copylocks check report a copied Loan.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

func (l *Loan) closeLocked(spent int64) {
	spent = clamp(spent, 0, l.units)
	l.state = loanClosed
	l.counted = spent
	l.a.spent += spent
	l.a.free += l.units - spent
}

// ReconcileCall reconciles the loans of all the tries of one call (all lent
// by the same ledger, nil for tries that were granted nothing) from a
// finished record's units_spent, which counts every try. Units already counted
// by loans that were settled are subtracted; the rest is spread over the open
// loans (held or reserved), each up to its grant, and what no open loan
// absorbs was spent by tries that were never granted it and is ignored. It
// returns the number of loans it reconciled. Each try's loan is listed once:
// a loan listed twice has its counted units subtracted twice.
func ReconcileCall(unitsSpent int64, loans ...*Loan) int {
	n, _ := ReconcileCallHeld(unitsSpent, loans...)
	return n
}

// ReconcileCallHeld is [ReconcileCall], which it also returns the result of
// (n), and reports held, the units of the loans it reconciled that were
// held ([Loan.Hold]) rather than reserved: the units it took off the
// ledger's held pile, read under the ledger's lock, so that a count of them
// never counts a unit twice or one a sealed ledger kept held.
func ReconcileCallHeld(unitsSpent int64, loans ...*Loan) (n int, held int64) {
	var a *Allowance
	for _, l := range loans {
		if !l.empty() {
			a = l.a
			break
		}
	}
	if a == nil {
		return 0, 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sealed {
		return 0, 0
	}
	rest := max(unitsSpent, 0)
	for _, l := range loans {
		if l != nil && l.a == a && l.state == loanClosed {
			rest -= l.counted
		}
	}
	rest = max(rest, 0)
	for _, l := range loans {
		if l == nil || l.a != a || l.state == loanClosed {
			continue
		}
		if l.state == loanHeld {
			a.held -= l.units
			held += l.units
		} else {
			a.reserved -= l.units
		}
		s := min(rest, l.units)
		rest -= s
		l.closeLocked(s)
		n++
	}
	return n, held
}

package budget_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/status"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func snap(total, free, reserved, held, spent int64) budget.Snapshot {
	return budget.Snapshot{Total: total, Free: free, Reserved: reserved, Held: held, Spent: spent}
}

// requireExhausted checks err is NOT_ADMITTED ALLOWANCE_EXHAUSTED with the
// given finality and remaining units.
func requireExhausted(t *testing.T, err error, final bool, remaining int64) {
	t.Helper()
	require.Error(t, err)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonAllowanceExhausted, o.Reason)
	require.Equal(t, final, o.Final())
	require.Equal(t, remaining, o.Detail.GetUnitsRemaining())
}

func TestZeroValue(t *testing.T) {
	var a budget.Allowance
	requireExhausted(t, a.Take(), false, 0)
	requireExhausted(t, a.Check(), false, 0)
	require.Nil(t, a.Lend(5))
	require.Nil(t, a.LendFree(0))
	require.Equal(t, budget.Snapshot{}, a.Snapshot())
	require.Equal(t, int64(0), a.Seal())
}

func TestNewAllowanceClamps(t *testing.T) {
	require.Equal(t, snap(0, 0, 0, 0, 0), budget.NewAllowance(-3).Snapshot())
	require.Equal(t, int64(budget.MaxUnits), budget.NewAllowance(1e18).Free())
	o := budget.NewAllowance(2, budget.AtOrigin()).Snapshot()
	require.True(t, o.Origin)
}

func TestTake(t *testing.T) {
	a := budget.NewAllowance(2)
	require.NoError(t, a.Check())
	require.NoError(t, a.Take())
	require.NoError(t, a.Take())
	require.Equal(t, snap(2, 0, 0, 0, 2), a.Snapshot())
	requireExhausted(t, a.Take(), false, 0) // not the origin: never final
	require.Equal(t, snap(2, 0, 0, 0, 2), a.Snapshot(), "a refusal changes nothing")
}

func TestFinalOnlyAtOriginWhenAllSpent(t *testing.T) {
	a := budget.NewAllowance(3, budget.AtOrigin())
	l := a.LendFree(0)
	require.Equal(t, int64(3), l.Units())
	// All lent, nothing spent yet: units may come back, so not final.
	requireExhausted(t, a.Check(), false, 0)
	require.True(t, l.Hold())
	requireExhausted(t, a.Take(), false, 0)
	require.True(t, l.Reconcile(2))
	require.Equal(t, int64(1), a.Free())
	require.NoError(t, a.Check())
	require.NoError(t, a.Take())
	require.Equal(t, snap(3, 0, 0, 0, 3), withoutFlags(a.Snapshot()))
	requireExhausted(t, a.Take(), true, 0)
	requireExhausted(t, a.Check(), true, 0)
}

func withoutFlags(s budget.Snapshot) budget.Snapshot {
	s.Origin, s.Sealed = false, false
	return s
}

func TestLend(t *testing.T) {
	a := budget.NewAllowance(10)
	require.NoError(t, a.Take())
	l := a.Lend(4)
	require.Equal(t, int64(4), l.Units())
	require.Equal(t, snap(10, 5, 4, 0, 1), a.Snapshot())
	big := a.Lend(100) // capped at what is free
	require.Equal(t, int64(5), big.Units())
	require.Nil(t, a.Lend(1), "nothing free: the empty grant")
	require.Nil(t, a.Lend(-1))
	require.Equal(t, snap(10, 0, 9, 0, 1), a.Snapshot())
}

func TestLendFreeKeepsUnitsForTries(t *testing.T) {
	a := budget.NewAllowance(6)
	require.NoError(t, a.Take()) // try 1 of 3: keep 2 for tries 2 and 3
	l := a.LendFree(2)
	require.Equal(t, int64(3), l.Units())
	require.Equal(t, snap(6, 2, 3, 0, 1), a.Snapshot())
	require.Nil(t, a.LendFree(2), "never negative")
	require.Nil(t, a.LendFree(5))
	require.Equal(t, int64(2), a.LendFree(-1).Units(), "negative keep counts as 0")
}

func TestSettle(t *testing.T) {
	tests := []struct {
		name     string
		reported int64
		want     budget.Snapshot
	}{
		{"spent part", 3, snap(10, 7, 0, 0, 3)},
		{"spent nothing", 0, snap(10, 10, 0, 0, 0)},
		{"spent all", 5, snap(10, 5, 0, 0, 5)},
		{"over-reported counts as the grant", 1e12, snap(10, 5, 0, 0, 5)},
		{"negative counts as 0", -4, snap(10, 10, 0, 0, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := budget.NewAllowance(10)
			l := a.Lend(5)
			require.True(t, l.Settle(tt.reported))
			require.Equal(t, tt.want, a.Snapshot())
			// Every further ending is a no-op.
			require.False(t, l.Settle(0))
			require.False(t, l.Refund())
			require.False(t, l.Hold())
			require.False(t, l.Reconcile(0))
			require.Equal(t, tt.want, a.Snapshot())
		})
	}
}

func TestRefund(t *testing.T) {
	a := budget.NewAllowance(4)
	l := a.Lend(4)
	require.True(t, l.Refund())
	require.Equal(t, snap(4, 4, 0, 0, 0), a.Snapshot())
	require.False(t, l.Refund(), "a loan is refunded once")
	require.Equal(t, snap(4, 4, 0, 0, 0), a.Snapshot())
}

func TestHoldThenReconcile(t *testing.T) {
	a := budget.NewAllowance(8)
	l := a.Lend(6)
	require.True(t, l.Hold())
	require.Equal(t, snap(8, 2, 0, 6, 0), a.Snapshot())
	require.False(t, l.Hold(), "held once")
	require.False(t, l.Settle(0), "a held grant is not refunded by a late report")
	require.Equal(t, snap(8, 2, 0, 6, 0), a.Snapshot())
	require.True(t, l.Reconcile(4))
	require.Equal(t, snap(8, 4, 0, 0, 4), a.Snapshot())
	require.False(t, l.Reconcile(0), "reconciled once")
	require.Equal(t, snap(8, 4, 0, 0, 4), a.Snapshot())

	// Reconcile straight from reserved, clamped to the grant.
	l2 := a.Lend(3)
	require.True(t, l2.Reconcile(99))
	require.Equal(t, snap(8, 1, 0, 0, 7), a.Snapshot())
}

func TestNilLoan(t *testing.T) {
	var l *budget.Loan
	require.Zero(t, l.Units())
	require.False(t, l.Settle(1))
	require.False(t, l.Refund())
	require.False(t, l.Hold())
	require.False(t, l.Reconcile(1))
	require.Zero(t, budget.ReconcileCall(3, l, nil))
}

func TestSeal(t *testing.T) {
	a := budget.NewAllowance(10)
	require.NoError(t, a.Take())
	reserved := a.Lend(3)
	held := a.Lend(2)
	require.True(t, held.Hold())
	settled := a.Lend(1)
	require.True(t, settled.Settle(1))
	require.Equal(t, snap(10, 3, 3, 2, 2), a.Snapshot())

	require.Equal(t, int64(7), a.Seal(), "1 taken + 1 reported + 3 reserved + 2 held")
	s := a.Snapshot()
	require.True(t, s.Sealed)
	require.Equal(t, snap(10, 3, 0, 0, 7), withoutFlags(s))

	// After the seal: takes and lends refused, loans frozen.
	err := a.Take()
	requireExhausted(t, err, false, 0)
	require.ErrorContains(t, err, "budget: ledger sealed")
	requireExhausted(t, a.Check(), false, 0)
	require.Nil(t, a.Lend(1))
	require.False(t, reserved.Refund())
	require.False(t, held.Reconcile(0))
	require.Zero(t, budget.ReconcileCall(0, reserved, held))
	require.Equal(t, int64(7), a.Seal(), "sealing again reports the same")
	require.Equal(t, snap(10, 3, 0, 0, 7), withoutFlags(a.Snapshot()))
}

func TestReconcileCall(t *testing.T) {
	a := budget.NewAllowance(20)
	try1 := a.Lend(5) // reported 2
	require.True(t, try1.Settle(2))
	try2 := a.Lend(4) // lost response
	require.True(t, try2.Hold())
	try3 := a.Lend(3) // also unknown
	require.True(t, try3.Hold())
	require.Equal(t, snap(20, 11, 0, 7, 2), a.Snapshot())

	// The record says the call spent 7 over all its tries: 2 were counted
	// by try 1, so tries 2 and 3 spent 5 of their 7 held units.
	require.Equal(t, 2, budget.ReconcileCall(7, try1, nil, try2, try3))
	require.Equal(t, snap(20, 13, 0, 0, 7), a.Snapshot())
	require.Zero(t, budget.ReconcileCall(7, try1, try2, try3), "once")

	// A record that counts less than already settled frees every open grant.
	b := budget.NewAllowance(5)
	x, y := b.Lend(2), b.Lend(2)
	require.True(t, x.Settle(2))
	require.True(t, y.Hold())
	require.Equal(t, 1, budget.ReconcileCall(1, x, y))
	require.Equal(t, snap(5, 3, 0, 0, 2), b.Snapshot())

	// Loans of another ledger are ignored.
	c := budget.NewAllowance(5)
	z := c.Lend(1)
	w := a.Lend(1)
	require.Equal(t, 1, budget.ReconcileCall(0, w, z))
	require.Equal(t, snap(5, 4, 1, 0, 0), c.Snapshot())
}

func TestSeedScenario(t *testing.T) {
	// Seed 000: the origin makes 3 tries, the frontend 2 tries per call, the
	// dependency refuses everything, 4 units: the dependency sees 4 calls
	// and the origin's third try is refused locally, final.
	origin := budget.NewAllowance(4, budget.AtOrigin())
	dependencyCalls := 0
	var lastErr error
	for try := 1; try <= 3; try++ {
		if lastErr = origin.Check(); lastErr != nil {
			break
		}
		grant := origin.LendFree(0) // the origin's tries are not charged
		frontend := budget.NewAllowance(grant.Units())
		for ftry := 1; ftry <= 2; ftry++ {
			if frontend.Take() != nil {
				break
			}
			dependencyCalls++ // refused: NOT_ADMITTED, trailer says nothing spent below
			frontend.LendFree(int64(2 - ftry)).Settle(0)
		}
		require.True(t, grant.Settle(frontend.Seal()))
	}
	require.Equal(t, 4, dependencyCalls)
	requireExhausted(t, lastErr, true, 0)
}

func TestConcurrentTakes(t *testing.T) {
	const units, workers = 500, 8
	a := budget.NewAllowance(units)
	var wg sync.WaitGroup
	var mu sync.Mutex
	taken := 0
	for range workers {
		wg.Go(func() {
			n := 0
			for a.Take() == nil {
				n++
				if l := a.Lend(1); l != nil {
					l.Settle(int64(n % 2))
				}
			}
			mu.Lock()
			taken += n
			mu.Unlock()
		})
	}
	wg.Wait()
	s := a.Snapshot()
	require.Equal(t, s.Total, s.Free+s.Reserved+s.Held+s.Spent)
	require.Equal(t, int64(0), s.Free)
	require.LessOrEqual(t, taken, units)
}

func TestContext(t *testing.T) {
	ctx := context.Background()
	_, ok := budget.FromContext(ctx)
	require.False(t, ok)
	_, ok = budget.FromContext(budget.NewContext(ctx, nil))
	require.False(t, ok)
	a := budget.NewAllowance(3)
	got, ok := budget.FromContext(budget.NewContext(ctx, a))
	require.True(t, ok)
	require.Same(t, a, got)

	_, ok = budget.GrantFromContext(ctx)
	require.False(t, ok)
	g, ok := budget.GrantFromContext(budget.WithGrant(ctx, 7))
	require.True(t, ok)
	require.Equal(t, int64(7), g)
	g, _ = budget.GrantFromContext(budget.WithGrant(ctx, -7))
	require.Equal(t, int64(0), g)
}

func TestSplit(t *testing.T) {
	grants := func(ctxs []context.Context) []int64 {
		var out []int64
		for _, c := range ctxs {
			g, ok := budget.GrantFromContext(c)
			require.True(t, ok)
			out = append(out, g)
		}
		return out
	}
	a := budget.NewAllowance(10)
	ctx := budget.NewContext(context.Background(), a)
	require.Equal(t, []int64{3, 2, 2}, grants(budget.Split(ctx, 3)))
	require.Equal(t, []int64{0, 0}, grants(budget.Split(budget.NewContext(ctx, budget.NewAllowance(1)), 2)))
	require.Equal(t, []int64{9}, grants(budget.Split(ctx, 1)))
	require.Nil(t, budget.Split(ctx, 0))
	// At the origin the calls' own sends are not charged: every free unit
	// is shared.
	origin := budget.NewContext(context.Background(), budget.NewAllowance(10, budget.AtOrigin()))
	require.Equal(t, []int64{4, 3, 3}, grants(budget.Split(origin, 3)))
	require.Equal(t, []int64{5, 5}, grants(budget.Split(budget.NewContext(context.Background(), budget.NewAllowance(10, budget.AtOrigin())), 2)))

	for _, c := range budget.Split(context.Background(), 2) {
		_, ok := budget.GrantFromContext(c)
		require.False(t, ok, "no ledger: default grants")
	}

	// Fan-out with the split grants never overspends, whatever the order.
	ctxs := budget.Split(ctx, 3)
	var total int64
	for i := len(ctxs) - 1; i >= 0; i-- {
		g, _ := budget.GrantFromContext(ctxs[i])
		require.NoError(t, a.Take())
		l := a.Lend(g)
		require.Equal(t, g, l.Units())
		total += 1 + l.Units()
	}
	require.Equal(t, int64(10), total)
	require.Equal(t, int64(0), a.Free())
}

var loanSink *budget.Loan

// The ledger's first loan lives in the ledger itself: lending once costs no
// allocation beyond the ledger's, and each later loan costs one. The loans
// stay independent whichever of them is ended first.
func TestFirstLoanIsStoredInTheLedger(t *testing.T) {
	ledgerOnly := testing.AllocsPerRun(200, func() {
		a := budget.NewAllowance(10)
		loanSink = a.Lend(0) // a nil loan: nothing reserved
	})
	oneLoan := testing.AllocsPerRun(200, func() {
		loanSink = budget.NewAllowance(10).Lend(3)
	})
	twoLoans := testing.AllocsPerRun(200, func() {
		a := budget.NewAllowance(10)
		a.Lend(3)
		loanSink = a.Lend(3)
	})
	require.Equal(t, ledgerOnly, oneLoan, "the first loan allocates nothing")
	require.Equal(t, oneLoan+1, twoLoans, "a second loan allocates once")

	a := budget.NewAllowance(10)
	first, second := a.Lend(3), a.Lend(4)
	require.Equal(t, snap(10, 3, 7, 0, 0), a.Snapshot())
	second.Settle(1)
	require.Equal(t, snap(10, 6, 3, 0, 1), a.Snapshot())
	first.Hold()
	require.Equal(t, snap(10, 6, 0, 3, 1), a.Snapshot())
	third := a.Lend(2)
	require.Equal(t, int64(2), third.Units())
	require.Equal(t, int64(3), first.Units(), "a later loan leaves the first one as it was")
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// Loan is an exported struct whose zero value the docs do not describe
// (only the nil *Loan was "the empty grant"). A zero Loan panics on every
// ending, and ReconcileCall, which takes its ledger from the first non-nil
// loan, ignores every real loan listed after it: their units stay held.
func TestZeroLoan(t *testing.T) {
	var zero budget.Loan
	require.NotPanics(t, func() { zero.Refund() }, "a zero Loan should behave as the empty grant, as a nil *Loan does")

	a := budget.NewAllowance(5)
	l := a.Lend(3)
	require.True(t, l.Hold())
	require.Equal(t, 1, budget.ReconcileCall(0, &budget.Loan{}, l), "the held loan is not reconciled")
	require.Equal(t, int64(5), a.Free())
}

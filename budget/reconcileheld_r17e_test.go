package budget_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
)

// TestReconcileCallHeldCountsHeldUnitsOnce: ReconcileCallHeld reports the
// units it took off the held pile (the interceptor's
// tollgate.allowance.reconciled): a reserved loan's are not held units, a
// second reconciliation takes nothing, and a sealed ledger keeps its held
// units (counted as spent for good).
func TestReconcileCallHeldCountsHeldUnitsOnce(t *testing.T) {
	a := budget.NewAllowance(10)
	held, reserved := a.Lend(3), a.Lend(2)
	require.True(t, held.Hold())
	n, units := budget.ReconcileCallHeld(1, held, nil, reserved)
	require.Equal(t, 2, n)
	require.Equal(t, int64(3), units, "only the held loan's units left the held pile")
	require.Zero(t, a.Snapshot().Held)
	n, units = budget.ReconcileCallHeld(1, held, reserved)
	require.Zero(t, n)
	require.Zero(t, units, "once")

	b := budget.NewAllowance(4)
	l := b.Lend(4)
	require.True(t, l.Hold())
	b.Seal()
	n, units = budget.ReconcileCallHeld(0, l)
	require.Zero(t, n)
	require.Zero(t, units, "a sealed ledger keeps what it held")
	require.Equal(t, budget.ReconcileCall(0, l), n, "ReconcileCall returns the same count")
}

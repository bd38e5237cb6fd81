package budget_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/budget"
)

// BenchmarkTakeLendSettle is one RPC's accounting on an uncontended ledger:
// take a unit, lend a grant, settle it from the callee's report.
func BenchmarkTakeLendSettle(b *testing.B) {
	a := budget.NewAllowance(budget.MaxUnits)
	b.ReportAllocs()
	for b.Loop() {
		if err := a.Take(); err != nil {
			b.Fatal(err)
		}
		a.LendFree(2).Settle(1)
		if a.Free() < 100 {
			b.StopTimer()
			a = budget.NewAllowance(budget.MaxUnits)
			b.StartTimer()
		}
	}
}

// BenchmarkTakeLeaf is a leaf call: take a unit, lend nothing (no
// allocation).
func BenchmarkTakeLeaf(b *testing.B) {
	a := budget.NewAllowance(budget.MaxUnits)
	b.ReportAllocs()
	for b.Loop() {
		if err := a.Take(); err != nil {
			b.StopTimer()
			a = budget.NewAllowance(budget.MaxUnits)
			b.StartTimer()
		}
		a.Lend(0).Refund()
	}
}

// BenchmarkTakeLendSettleParallel is the same on one ledger shared by every
// goroutine (a fan-out handler).
func BenchmarkTakeLendSettleParallel(b *testing.B) {
	var cur atomic.Pointer[budget.Allowance]
	cur.Store(budget.NewAllowance(budget.MaxUnits))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			a := cur.Load()
			if a.Take() != nil {
				// Exhausted: start a fresh ledger (rare; keeps the refusal
				// path out of the measurement).
				cur.CompareAndSwap(a, budget.NewAllowance(budget.MaxUnits))
				continue
			}
			a.Lend(3).Settle(1)
		}
	})
}

// BenchmarkExhausted is the refusal of a take with no free unit.
func BenchmarkExhausted(b *testing.B) {
	a := budget.NewAllowance(0)
	b.ReportAllocs()
	for b.Loop() {
		if a.Take() == nil {
			b.Fatal("took from an empty ledger")
		}
	}
}

func BenchmarkSplit3(b *testing.B) {
	ctx := budget.NewContext(context.Background(), budget.NewAllowance(100))
	b.ReportAllocs()
	for b.Loop() {
		_ = budget.Split(ctx, 3)
	}
}

func BenchmarkRetryBudget(b *testing.B) {
	rb, err := budget.NewRetryBudget()
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		rb.DepositAt(now)
		rb.WithdrawAt(now)
	}
}

func BenchmarkRetryBudgetParallel(b *testing.B) {
	rb, err := budget.NewRetryBudget()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rb.Deposit()
			rb.Withdraw()
		}
	})
}

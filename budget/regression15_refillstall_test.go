package budget_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/budget"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// With a floor above 1000 tokens/s a millionth of a token takes less than a
// nanosecond. refillLocked moves last by time.Duration(whole/(rate*micro)
// seconds), truncated to whole nanoseconds, so the time of a few millionths
// rounds to 0 ns: last does not move, and the same elapsed nanosecond is
// counted again on every read. Tokens then accrue with the number of reads,
// not with time: reading the budget 1000000 times at one instant earns far
// more than the 1 ns the clock moved.
func TestRegression15BudgetRefillStall(t *testing.T) {
	const rate = 2500.0 // tokens/s: 1 ns = 2.5 millionths, 2 whole ones take 0.8 ns
	b, err := budget.NewRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(rate), budget.WithMaxRetryTokens(10))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1_700_000_000, 0)
	for b.WithdrawAt(start) { // drain the reserve; last = start
	}
	now := start.Add(time.Nanosecond)
	for i := 0; i < 1_000_000; i++ {
		_ = b.TokensAt(now)
	}
	got := b.TokensAt(now)
	want := rate * 1e-9 // what 1 ns earns at this floor (the drain leaves 0)
	if got > want+1e-6 {
		t.Fatalf("1 ns at a floor of %v tokens/s earns %.6f tokens; read 1000000 times at the same instant the budget holds %.6f", rate, want, got)
	}
	if b.WithdrawAt(now) {
		t.Fatalf("a retry admitted 1 ns after draining the budget (tokens at that instant grew with reads, not time)")
	}
}

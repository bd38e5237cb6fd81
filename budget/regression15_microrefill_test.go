package budget_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/budget"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// The floor of WithMinRetriesPerSecond accrues in whole millionths: each
// refill truncates what elapsed to whole micro-tokens and moves last to now,
// dropping the remainder. A budget touched every 1.9 µs (a busy client:
// every Deposit, Withdraw and Tokens refills) earns 1 millionth per touch
// instead of 1.9: the floor accrues at about half its rate.
func TestRegression15BudgetMicroRefill(t *testing.T) {
	b, err := budget.NewRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(1), budget.WithMaxRetryTokens(10))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1_700_000_000, 0)
	now := start
	for b.WithdrawAt(now) { // drain the reserve
	}
	step := 1900 * time.Nanosecond
	for now.Sub(start) < 2*time.Second {
		now = now.Add(step)
		_ = b.TokensAt(now)
	}
	if got := b.TokensAt(now); got < 1.9 {
		t.Fatalf("2 s at a floor of 1 token/s, read every %v, earned %.3f tokens, not 2", step, got)
	}
	if !b.WithdrawAt(now) {
		t.Fatal("no token after 2 s at a floor of 1 token/s")
	}
}

package budget_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/budget"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// The time floor's refill moves last by the time its whole millionths took,
// converted with time.Duration(float), which truncates to whole
// nanoseconds (and float error sometimes makes whole one less than the
// millionths elapsed). The nanosecond fraction dropped from last's advance
// is counted again by the next refill, so a budget read often accrues faster
// than its rate: here a floor of 3333 tokens/s read 10 times per 100 ns
// tick (a busy client: every Deposit, Withdraw and Tokens refills) for
// 100 ms earns about 8% more than 333.3 tokens.
func TestRegression15BudgetRefillFast(t *testing.T) {
	const rate = 3333.0
	b, err := budget.NewRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(rate), budget.WithMaxRetryTokens(1e5))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1_700_000_000, 0)
	for b.WithdrawAt(start) { // drain the reserve; last = start
	}
	base := b.TokensAt(start)
	now := start
	for now.Sub(start) < 10*time.Millisecond {
		now = now.Add(100 * time.Nanosecond)
		for j := 0; j < 10; j++ {
			_ = b.TokensAt(now.Add(time.Duration(j)))
		}
	}
	end := now.Add(9)
	got := b.TokensAt(end) - base
	want := end.Sub(start).Seconds() * rate
	if got > want*1.01 {
		t.Fatalf("%v at a floor of %v tokens/s should earn %.3f tokens; read every 10 ns it earned %.3f (x%.3f)",
			end.Sub(start), rate, want, got, got/want)
	}
}

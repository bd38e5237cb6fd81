package budget_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/budget"
)

// A review found that, with the default ratio 0.1 and no time floor, ten
// first tries did not earn the one retry they pay for ("retries stay within
// 10% of requests"): ten float64 sums of 0.1 make 0.9999999999999999. The
// bucket now counts in millionths of a token.
func TestRegression15RetryRatio(t *testing.T) {
	b, err := budget.NewRetryBudget(budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	if !b.WithdrawAt(now) {
		t.Fatal("a new budget starts with its reserve")
	}
	for range 10 {
		b.DepositAt(now)
	}
	if !b.WithdrawAt(now) {
		t.Fatalf("10 first tries at ratio 0.1 earned %.17g tokens: the retry they paid for is refused", b.TokensAt(now))
	}
}

// A token withdrawn for a retry that was never sent comes back, up to the
// cap: the budget bounds retries sent.
func TestRetryBudgetReturn(t *testing.T) {
	b, err := budget.NewRetryBudget(budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1), budget.WithRetryRatio(0))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	if !b.WithdrawAt(now) || b.WithdrawAt(now) {
		t.Fatal("one token, then none")
	}
	b.Return()
	if got := b.TokensAt(now); got != 1 {
		t.Fatalf("after Return: %v tokens, want 1", got)
	}
	b.Return()
	if got := b.TokensAt(now); got != 1 {
		t.Fatalf("Return past the cap: %v tokens, want 1", got)
	}
}

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

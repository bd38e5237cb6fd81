package budget_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
)

var t0 = time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)

func TestRetryBudgetZeroValueRefuses(t *testing.T) {
	var b budget.RetryBudget
	b.DepositAt(t0)
	require.False(t, b.WithdrawAt(t0.Add(time.Hour)))
	require.Zero(t, b.TokensAt(t0.Add(time.Hour)))
}

func TestRetryBudgetOptions(t *testing.T) {
	for _, opt := range []budget.RetryBudgetOption{
		budget.WithRetryRatio(-0.1), budget.WithRetryRatio(1.5), budget.WithRetryRatio(math.NaN()),
		budget.WithMinRetriesPerSecond(-1), budget.WithMinRetriesPerSecond(math.Inf(1)),
		budget.WithMaxRetryTokens(0.5), budget.WithMaxRetryTokens(math.NaN()),
	} {
		b, err := budget.NewRetryBudget(opt)
		require.ErrorIs(t, err, budget.ErrInvalidRetryBudget)
		require.ErrorContains(t, err, "budget: invalid retry budget: ")
		require.Nil(t, b)
	}
	b, err := budget.NewRetryBudget(nil)
	require.NoError(t, err)
	require.Equal(t, budget.DefaultMaxRetryTokens, b.TokensAt(t0), "starts with the whole reserve")
}

// TestRetryBudgetStopsAStorm: 1000 calls that all fail, each wanting to
// retry twice, within 10 seconds: retries stay within 10% of the requests
// plus the floor (1/s) and the initial reserve.
func TestRetryBudgetStopsAStorm(t *testing.T) {
	b, err := budget.NewRetryBudget()
	require.NoError(t, err)
	const calls = 1000
	const span = 10 * time.Second
	retries := 0
	for i := range calls {
		now := t0.Add(span * time.Duration(i) / calls)
		b.DepositAt(now) // first try
		for range 2 {
			if b.WithdrawAt(now) {
				retries++
			}
		}
	}
	limit := calls*budget.DefaultRetryRatio + span.Seconds()*budget.DefaultMinRetriesPerSecond + budget.DefaultMaxRetryTokens
	require.LessOrEqual(t, float64(retries), limit)
	require.Greater(t, retries, calls/20, "the budget still lets some retries through")
}

func TestRetryBudgetFloorAndCap(t *testing.T) {
	b, err := budget.NewRetryBudget(budget.WithMinRetriesPerSecond(2), budget.WithMaxRetryTokens(5), budget.WithRetryRatio(0.5))
	require.NoError(t, err)
	for range 5 {
		require.True(t, b.WithdrawAt(t0))
	}
	require.False(t, b.WithdrawAt(t0), "the initial reserve is spent")
	require.False(t, b.WithdrawAt(t0.Add(400*time.Millisecond)), "0.8 tokens")
	require.True(t, b.WithdrawAt(t0.Add(500*time.Millisecond)), "1 token after half a second at 2/s")
	require.InDelta(t, 5.0, b.TokensAt(t0.Add(time.Hour)), 1e-9, "capped")
	// Time going backwards adds nothing.
	require.InDelta(t, 5.0, b.TokensAt(t0), 1e-9)
	b.DepositAt(t0.Add(time.Hour))
	require.InDelta(t, 5.0, b.TokensAt(t0.Add(time.Hour)), 1e-9, "deposits are capped too")

	c, err := budget.NewRetryBudget(budget.WithMinRetriesPerSecond(0), budget.WithRetryRatio(0.5), budget.WithMaxRetryTokens(1))
	require.NoError(t, err)
	require.True(t, c.WithdrawAt(t0), "the reserve of one token")
	require.False(t, c.WithdrawAt(t0))
	c.DepositAt(t0)
	require.False(t, c.WithdrawAt(t0))
	c.DepositAt(t0)
	require.True(t, c.WithdrawAt(t0), "two requests earn one retry at ratio 0.5")
	require.False(t, c.WithdrawAt(t0.Add(time.Hour)), "no floor")
}

func TestRetryBudgetRealClock(t *testing.T) {
	b, err := budget.NewRetryBudget()
	require.NoError(t, err)
	b.Deposit()
	require.True(t, b.Withdraw())
	require.GreaterOrEqual(t, b.Tokens(), 0.0)
}

package budget_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/budget"
)

// Delay says when the time floor alone gives the budget its next whole
// token, and that much time later a Withdraw succeeds, not a nanosecond
// sooner from the floor alone.
func TestR18RetryBudgetDelayIsWhenTheFloorRefills(t *testing.T) {
	b, err := budget.NewRetryBudget(budget.WithMinRetriesPerSecond(2), budget.WithMaxRetryTokens(1))
	require.NoError(t, err)
	t0 := time.Unix(1_700_000_000, 0)
	d, ok := b.DelayAt(t0)
	require.True(t, ok)
	require.Zero(t, d, "a full budget has a token now")
	require.True(t, b.WithdrawAt(t0))
	d, ok = b.DelayAt(t0)
	require.True(t, ok)
	require.Equal(t, 500*time.Millisecond, d, "2 tokens a second: one in half a second")
	require.False(t, b.WithdrawAt(t0.Add(d-time.Millisecond)))
	d, ok = b.DelayAt(t0.Add(d - time.Millisecond))
	require.True(t, ok)
	require.Equal(t, time.Millisecond, d)
	require.True(t, b.WithdrawAt(t0.Add(500*time.Millisecond)))

	// A deposit counts: ten first tries at the default ratio earn a token.
	for range 10 {
		b.DepositAt(t0.Add(500 * time.Millisecond))
	}
	d, ok = b.DelayAt(t0.Add(500 * time.Millisecond))
	require.True(t, ok)
	require.Zero(t, d)
}

// With no floor, an empty budget can only be refilled by deposits: Delay
// says it cannot tell when.
func TestR18RetryBudgetDelayWithoutFloor(t *testing.T) {
	b, err := budget.NewRetryBudget(budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1))
	require.NoError(t, err)
	t0 := time.Unix(1_700_000_000, 0)
	require.True(t, b.WithdrawAt(t0))
	_, ok := b.DelayAt(t0.Add(time.Hour))
	require.False(t, ok)
	var zero budget.RetryBudget
	_, ok = zero.DelayAt(t0)
	require.False(t, ok, "the zero value earns nothing")
}

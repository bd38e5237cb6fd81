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

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// The floor of WithMinRetriesPerSecond accrues in whole millionths: each
// refill truncates what elapsed to whole micro-tokens and moves last to now,
// dropping the remainder. A budget touched every 1.9 µs (a busy client:
// every Deposit, Withdraw and Tokens refills) earns 1 millionth per touch
// instead of 1.9: the floor accrues at about half its rate.
func TestBudgetMicroRefill(t *testing.T) {
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
func TestBudgetRefillFast(t *testing.T) {
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
func TestBudgetRefillStall(t *testing.T) {
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

// A review found that, with the default ratio 0.1 and no time floor, ten
// first tries did not earn the one retry they pay for ("retries stay within
// 10% of requests"): ten float64 sums of 0.1 make 0.9999999999999999. The
// bucket now counts in millionths of a token.
func TestRetryRatio(t *testing.T) {
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

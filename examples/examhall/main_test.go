package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func defaults() Config {
	return Config{FirstDeadline: 2, LowFirst: 2, OverloadFirst: 8, SecondAt: 2, Second: 2, SecondDeadline: 4,
		Horizon: 4, BoundedInside: 2, ServiceTicks: 1, CatalogInside: 2, CatalogWaiting: 3, CatalogDeadline: 1,
		CatalogHorizon: 3, Timeout: time.Minute}
}

// TestSeedCounts checks seed 003's numbers: low=4 unbounded=2 bounded=4 and
// the catalog waiting room (inside 2, outside 3) with one useful result,
// and tollgate's deadline-aware counterparts beside them.
func TestSeedCounts(t *testing.T) {
	rep, err := Run(defaults())
	require.NoError(t, err)
	require.Equal(t, 4, rep.Low)
	require.Equal(t, 2, rep.Unbounded)
	require.Equal(t, 4, rep.Bounded)
	require.Equal(t, 1, rep.CatalogUseful)
	require.Equal(t, 4, rep.Scenarios["low_bounded"].Useful, "admission costs nothing under low load")

	u := rep.Scenarios["unbounded"]
	require.Equal(t, 10, u.Completed, "the FIFO runs expired work")
	require.Equal(t, 8, u.Late)
	// The seed's MR !1840: total inside limited to two, excess arrivals
	// refused early; the inside bound alone decides, not a deadline stage.
	b := rep.Scenarios["bounded"]
	require.Equal(t, 4, b.Completed)
	require.Zero(t, b.Late, "bounded admission runs no expired work here")
	require.Equal(t, map[string]int{"QUEUE_FULL": 6}, b.Refused)
	require.Equal(t, 2, b.Inside+b.Waiting)
	bd := rep.Scenarios["bounded_deadline"]
	require.Equal(t, 4, rep.BoundedDeadline)
	require.Equal(t, map[string]int{"DEADLINE_UNREACHABLE": 6}, bd.Refused)

	// The seed's gateway discards only waiters whose deadline has passed:
	// at tick 1 it admits C exactly at its deadline, and C finishes late
	// at tick 3; D and E are discarded at tick 2.
	c := rep.Scenarios["catalog"]
	require.Equal(t, 2, c.Inside)
	require.Equal(t, 3, c.Waiting)
	require.Equal(t, 3, c.Completed)
	require.Equal(t, 2, c.Late)
	require.Equal(t, 2, c.Discarded)
	require.Empty(t, c.Refused)
	require.Equal(t, 3, c.LastTick)
	// tollgate also drops a waiter that cannot finish by its deadline: C
	// is dropped unrun at tick 1, the same one useful result with one job
	// less wasted.
	ct := rep.Scenarios["catalog_tollgate"]
	require.Equal(t, 1, rep.CatalogTollgateUseful)
	require.Equal(t, 2, ct.Inside)
	require.Equal(t, 3, ct.Waiting)
	require.Equal(t, 2, ct.Completed)
	require.Equal(t, 1, ct.Late)
	require.Equal(t, 3, ct.Discarded, "waiting entries dropped unrun at dequeue")
	require.Empty(t, ct.Refused)
	require.Equal(t, 2, ct.LastTick)

	var out bytes.Buffer
	Print(&out, rep)
	require.Contains(t, out.String(), "configured: bounded inside=2 (1 on the worker's slot + 1 queued)")
	require.Contains(t, out.String(), "example useful completions: low=4 unbounded=2 bounded=4")
	require.Contains(t, out.String(), "waiting room admission layout: inside=2 outside=3; absolute-deadline useful=1")
	require.Contains(t, out.String(), "seed's gateway (discards passed deadlines): useful=1, ran 3 (late 2), discarded 2")
	require.Contains(t, out.String(), "useful=1, ran 2 (late 1), discarded 3")
}

// TestBoundedInsideChangesCount: the bounded run is the inside bound alone,
// so -bounded-inside decides it. A review found the bounded run with
// tollgate's deadline stage on as well, which refused every excess arrival
// DEADLINE_UNREACHABLE before the bound mattered: -bounded-inside 3 and 100
// still printed bounded=4.
func TestBoundedInsideChangesCount(t *testing.T) {
	cfg := defaults()
	cfg.BoundedInside = 3
	rep, err := Run(cfg)
	require.NoError(t, err)
	b := rep.Scenarios["bounded"]
	require.Equal(t, 3, rep.Bounded, "the third of the first wave finishes late at tick 3, the second wave's second at tick 5")
	require.Equal(t, map[string]int{"QUEUE_FULL": 5}, b.Refused)
	require.Equal(t, 2, b.Late)
	require.Equal(t, 3, b.Inside+b.Waiting)
	require.Equal(t, 4, rep.BoundedDeadline, "the deadline stages keep refusing what cannot finish in time")

	cfg.BoundedInside = 100
	rep, err = Run(cfg)
	require.NoError(t, err)
	require.Equal(t, rep.Unbounded, rep.Bounded, "a bound above the load admits everything, as no bound does")
	require.Empty(t, rep.Scenarios["bounded"].Refused)
	require.Equal(t, 4, rep.BoundedDeadline)
}

// TestFlagsChangeCounts: a later first deadline lets more of the FIFO's
// backlog count, while the inside bound of two still admits only two of
// each wave.
func TestFlagsChangeCounts(t *testing.T) {
	cfg := defaults()
	cfg.FirstDeadline = 3
	rep, err := Run(cfg)
	require.NoError(t, err)
	require.Equal(t, 3, rep.Unbounded) // jobs finishing at ticks 1, 2, 3
	require.Equal(t, 4, rep.Bounded)   // inside=2 still bounds it: two of each wave
	require.Equal(t, map[string]int{"QUEUE_FULL": 6}, rep.Scenarios["bounded"].Refused)
}

// TestOneBoundForTheWholeRun: -timeout bounds the whole run, not each
// scenario. A review found each scenario making its own context with the
// full timeout, so five scenarios could take five times it. RunContext
// runs every scenario within the one context Run makes; a context already
// ended stops the run at the first scenario.
func TestOneBoundForTheWholeRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := RunContext(ctx, defaults())
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "low:", "the first scenario already runs out of the run's bound")
}

// TestOnTimeAfterTheHorizonIsNotLate: a job finished by its deadline but
// after the horizon is neither useful (outside the window counted) nor late
// (it met its deadline). A review found the low-load run with -horizon 0
// reporting all four on-time jobs as late.
func TestOnTimeAfterTheHorizonIsNotLate(t *testing.T) {
	cfg := defaults()
	cfg.Horizon = 0
	rep, err := Run(cfg)
	require.NoError(t, err)
	low := rep.Scenarios["low"]
	require.Equal(t, 4, low.Completed)
	require.Zero(t, low.Useful)
	require.Zero(t, low.Late, "every job met its deadline")
	require.Equal(t, 4, low.After)
	var out bytes.Buffer
	Print(&out, rep)
	require.Contains(t, out.String(), "completed 4 (late 0, 4 on time after the horizon)")
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestNegativeWaveCountIsRefused: a negative job count
// (-low-first, -overload-first, -second) is a bad flag value. Run must
// refuse it up front with a clear error, as it does a zero -service-ticks;
// instead it starts the scenarios, a handler waits on a job the worker
// never runs, and the run ends only at its timeout with "run did not
// finish within …", which names no flag.
func TestNegativeWaveCountIsRefused(t *testing.T) {
	for _, set := range []func(*Config){
		func(c *Config) { c.LowFirst = -1 },
		func(c *Config) { c.OverloadFirst = -3 },
		func(c *Config) { c.Second = -1 },
	} {
		cfg := defaults()
		cfg.Timeout = 2 * time.Second
		set(&cfg)
		_, err := Run(cfg)
		require.Error(t, err, "a negative job count must be refused")
		require.NotContains(t, err.Error(), "did not finish", "the error must name the bad value, not a timeout")
	}
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestWaveBeforeTickZeroIsRefused: the virtual clock starts at
// tick 0 and never goes back, so -second-at -1 cannot happen as configured.
// Run accepts it, runs the second wave at tick 0 (with the first), and
// reports the wave as having arrived at tick -1.
func TestWaveBeforeTickZeroIsRefused(t *testing.T) {
	cfg := defaults()
	cfg.SecondAt = -1
	rep, err := Run(cfg)
	if err == nil {
		t.Fatalf("accepted -second-at -1; reported waves %v although the wave ran at tick 0", rep.Scenarios["low"].Waves)
	}
}

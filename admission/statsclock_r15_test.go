package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Stats, Mode and Overrides, which read the controller "now", read the wall
// clock even while the controller was driven on a virtual clock (its last
// admission an AdmitAt): asking for a snapshot of a simulation set in 2020
// brought it up to the wall clock, expiring an override set for an hour of
// virtual time (and closing years of degradation windows). ClearOverride
// and RetryAfter act at the latest time the caller gave then; so do these.
func TestStatsModeOverridesDoNotMoveAVirtualClock(t *testing.T) {
	for _, tc := range []struct {
		name string
		look func(c *admission.Controller)
	}{
		{"Stats", func(c *admission.Controller) { _ = c.Stats() }},
		{"Mode", func(c *admission.Controller) { _ = c.Mode() }},
		{"Overrides", func(c *admission.Controller) { _ = c.Overrides() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, t0 := virtualCtl(t)
			ctx := context.Background()
			_, err := c.SetOverrideAt(ctx, admission.Override{Actor: "test", Reason: "freeze for an hour", Class: "other", Freeze: true, TTL: time.Hour}, t0)
			require.NoError(t, err)
			_, err = c.SetOverrideAt(ctx, admission.Override{Actor: "test", Reason: "degraded for an hour", Mode: admission.ModeDegraded, TTL: time.Hour}, t0)
			require.NoError(t, err)

			tc.look(c)

			require.Len(t, c.Overrides(), 2, "an override set for an hour of virtual time was expired by the wall clock")
			require.Equal(t, admission.ModeDegraded, c.Mode())
			require.Equal(t, admission.ModeDegraded, c.Stats().Mode)
			_, err = c.AdmitAt(ctx, work("/demo.Other/Do"), t0.Add(time.Second))
			require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason,
				"the freeze, set for an hour of virtual time, was expired by the wall clock: %v", err)
			// The controller's time is still the caller's: the overrides
			// end an hour of virtual time after t0, not before.
			require.Len(t, c.OverridesAt(t0.Add(time.Hour-time.Nanosecond)), 2)
			require.Empty(t, c.OverridesAt(t0.Add(time.Hour)))
			require.Equal(t, admission.ModeNormal, c.Mode())
		})
	}
}

// On the controller's own clock (no AdmitAt), Stats, Mode and Overrides
// still read it: an override expires when that clock passes its TTL.
func TestStatsModeOverridesReadTheOwnClock(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4}))
	_, err := c.SetOverride(context.Background(), admission.Override{Actor: "test", Reason: "degraded for a minute", Mode: admission.ModeDegraded, TTL: time.Minute})
	require.NoError(t, err)
	p, err := c.Admit(context.Background(), work("/demo.W/Do"))
	require.NoError(t, err)
	p.Release()
	require.Equal(t, admission.ModeDegraded, c.Mode())
	require.Len(t, c.Overrides(), 1)
	clk.Advance(time.Minute)
	require.Equal(t, admission.ModeNormal, c.Stats().Mode)
	require.Empty(t, c.Overrides())
	require.Equal(t, admission.ModeNormal, c.Mode())
}

// Found alongside: a request arriving drops first the waiters of its class
// that can no longer finish by their deadlines (the dequeue stage), starts
// what can start, then predicts its wait (decideLocked); Stats did neither,
// so its PredictedWait counted a doomed waiter's work until something else
// (a degradation window closing, an override expiring) happened to drop
// it. On a clock without give-up timers (virtual, or WithClock's), a class
// whose only waiter could no longer finish predicted that waiter's second
// of work ahead of a request arriving now, which admission, dropping it,
// does not count: it predicted 100 ms and queued a request that could wait
// only that. Stats now brings the queues up to date as an arrival would:
// the snapshot no longer lists the waiter, and its prediction is
// admission's.
func TestStatsLeavesOutWaitersThatCannotFinish(t *testing.T) {
	for _, virtual := range []bool{true, false} {
		name := map[bool]string{true: "AdmitAt", false: "WithClock"}[virtual]
		t.Run(name, func(t *testing.T) {
			clk := newClock()
			t0 := clk.Now()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}),
				admission.WithDefaultClass("w"), admission.WithSafetyMargin(0),
				// No window closes in the test: closing one pumps, which
				// drops the waiter too.
				admission.WithDegradation(admission.Degradation{Window: time.Hour}))
			admit := func(ctx context.Context, r admission.Request, at time.Time) (*admission.Permit, error) {
				if virtual {
					return c.AdmitAt(ctx, r, at)
				}
				return c.Admit(ctx, r)
			}
			stats := func(at time.Time) admission.ClassStats {
				var s admission.Stats
				if virtual {
					s = c.StatsAt(at)
				} else {
					s = c.Stats()
				}
				st, ok := s.Class("w")
				require.True(t, ok)
				return st
			}
			// queue has a request with the given deadline wait (its Admit
			// at at), until Stats at at lists it queued; its Admit's error
			// comes on the channel (a permit it gets is abandoned).
			queue := func(deadline, at time.Time) <-chan error {
				done := make(chan error, 1)
				go func() {
					r := work("/demo.W/Do")
					r.Deadline = deadline
					p, err := admit(ctx, r, at)
					if p != nil {
						p.Abandon()
					}
					done <- err
				}()
				for stats(at).Queued != 1 {
					time.Sleep(time.Millisecond)
				}
				return done
			}
			p1, err := admit(ctx, work("/demo.W/Do"), t0)
			require.NoError(t, err)
			// A waiter that fits exactly: 1 s of wait, 1 s of service.
			first := queue(t0.Add(2*time.Second), t0)
			// At t0 + 1.5 s it can no longer finish (1 s of service left,
			// 0.5 s to its deadline); p1 is overdue (a tenth of the mean
			// left: 100 ms).
			now := clk.Advance(1500 * time.Millisecond)
			st := stats(now)
			require.Equal(t, 100*time.Millisecond, st.PredictedWait,
				"Stats counted the work of a waiter that admission drops before it predicts")
			require.Zero(t, st.Queued, "the snapshot lists a waiter that can no longer finish")
			require.Zero(t, st.QueuedWork)
			require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(<-first).Reason)

			// Admission agrees: a request that can wait just that is queued.
			second := queue(now.Add(1100*time.Millisecond), now)
			cancel()
			require.Error(t, <-second)
			p1.ReleaseAt(now)
		})
	}
}

// A waiter that leaves on a virtual clock pumps nothing (its caller's time
// is the caller's to give): a lending class whose held waiter left lends
// its idle slots again only at the next call that pumps. A request
// arriving then starts the waiting borrower and takes another idle slot at
// once; Stats predicted the borrower's work and the running request's
// still ahead of it, a wait of 2 s where admission admits at once.
func TestStatsStartsWhatCanStartFirst(t *testing.T) {
	t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	c, err := admission.New(admission.WithClasses(
		admission.Class{Name: "lender", Slots: 3, QueueItems: 4, LendIdle: true, TenantRunning: 1, ExpectedServiceTime: time.Second},
		admission.Class{Name: "b", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}),
		admission.WithDefaultClass("b"), admission.WithMethods("lender", "/demo.L/"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	ra := work("/demo.L/Do")
	ra.Tenant = "a"
	pA, err := c.AdmitAt(ctx, ra, t0)
	require.NoError(t, err)
	// Tenant a's next request waits for its own running one: the lender,
	// with a waiter, lends nothing.
	ctxA, cancelA := context.WithCancel(ctx)
	heldA := make(chan error, 1)
	go func() { _, err := c.AdmitAt(ctxA, ra, t0); heldA <- err }()
	for s, _ := c.StatsAt(t0).Class("lender"); s.Queued != 1; s, _ = c.StatsAt(t0).Class("lender") {
		time.Sleep(time.Millisecond)
	}
	pB, err := c.AdmitAt(ctx, work("/demo.B/Do"), t0)
	require.NoError(t, err)
	borrower := make(chan *admission.Permit, 1)
	go func() { p, _ := c.AdmitAt(ctx, work("/demo.B/Do"), t0); borrower <- p }()
	for s, _ := c.StatsAt(t0).Class("b"); s.Queued != 1; s, _ = c.StatsAt(t0).Class("b") {
		time.Sleep(time.Millisecond)
	}
	cancelA()
	require.ErrorIs(t, <-heldA, context.Canceled)

	st, _ := c.StatsAt(t0).Class("b")
	require.Zero(t, st.PredictedWait, "a request of b arriving now starts at once, on the lender's idle slot")
	require.Zero(t, st.Queued, "the borrower can start on the lender's idle slot: an arrival starts it first")
	require.Equal(t, 2, st.Running)
	pW := <-borrower
	require.NotNil(t, pW)
	p, d, err := c.AdmitDecisionAt(ctx, work("/demo.B/Do"), t0)
	require.NoError(t, err)
	require.Zero(t, d.QueuedAhead)
	for _, p := range []*admission.Permit{p, pW, pB, pA} {
		p.ReleaseAt(t0.Add(time.Second))
	}
}

// SetOverride, the plain form of SetOverrideAt, set an override at the
// wall clock's time on a controller driven by AdmitAt: in a simulation set
// in 2020 a freeze for a minute lasted until the wall clock's time plus a
// minute, years of virtual time, and setting it moved the controller to
// the wall clock (closing every window in between). It is set at the
// latest time the caller gave, as ClearOverride clears one.
func TestSetOverrideDoesNotMoveAVirtualClock(t *testing.T) {
	c, t0 := virtualCtl(t)
	ctx := context.Background()
	_, err := c.SetOverride(ctx, admission.Override{Actor: "test", Reason: "freeze for a minute", Class: "other", Freeze: true, TTL: time.Minute})
	require.NoError(t, err)
	list := c.OverridesAt(t0)
	require.Len(t, list, 1)
	require.Equal(t, t0, list[0].Set, "set at the wall clock's time, not the caller's")
	_, err = c.AdmitAt(ctx, work("/demo.Other/Do"), t0.Add(time.Second))
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason, "%v", err)
	p, err := c.AdmitAt(ctx, work("/demo.Other/Do"), t0.Add(time.Minute))
	require.NoError(t, err, "the freeze for a minute of virtual time outlived it")
	p.ReleaseAt(t0.Add(time.Minute))
}

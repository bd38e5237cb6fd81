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
			c, err := admission.New(admission.WithClasses(
				admission.Class{Name: "work", Slots: 1, QueueItems: 4},
				admission.Class{Name: "other", Slots: 1}),
				admission.WithDefaultClass("work"), admission.WithMethods("other", "/demo.Other/"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
			ctx := context.Background()
			p, err := c.AdmitAt(ctx, work("/demo.W/Do"), t0)
			require.NoError(t, err)
			p.ReleaseAt(t0)
			_, err = c.SetOverrideAt(ctx, admission.Override{Actor: "test", Reason: "freeze for an hour", Class: "other", Freeze: true, TTL: time.Hour}, t0)
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

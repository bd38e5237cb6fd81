package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A review found that ClearOverride, which has no …At form, read the wall
// clock even while the controller was driven on a virtual clock (AdmitAt):
// clearing one override brought a simulation set in 2020 up to the wall
// clock, expiring every other override set for an hour of virtual time and
// closing years of degradation windows. While the last admission was an
// AdmitAt, ClearOverride acts at the latest time the caller gave, as
// RetryAfter and a waiter's cancellation do.
func TestClearOverrideDoesNotMoveAVirtualClock(t *testing.T) {
	c, t0 := virtualCtl(t)
	ctx := context.Background()
	_, err := c.SetOverrideAt(ctx, admission.Override{Actor: "test", Reason: "freeze for an hour", Class: "other", Freeze: true, TTL: time.Hour}, t0)
	require.NoError(t, err)
	id, err := c.SetOverrideAt(ctx, admission.Override{Actor: "test", Reason: "one slot for an hour", Class: "work", Slots: 1, TTL: time.Hour}, t0)
	require.NoError(t, err)
	require.True(t, c.ClearOverride(ctx, id))

	_, err = c.AdmitAt(ctx, work("/demo.Other/Do"), t0.Add(time.Second))
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason,
		"the freeze, set for an hour of virtual time, was expired by the wall clock: %v", err)
	require.Len(t, c.OverridesAt(t0.Add(time.Second)), 1)
}

// virtualCtl is a controller with a class work (1 slot, a queue of 4, the
// default) and a class other (1 slot, /demo.Other/), driven on a virtual
// clock: a request of work admitted and released by AdmitAt at t0, New
// Year 2020, far behind the wall clock.
func virtualCtl(t *testing.T) (*admission.Controller, time.Time) {
	t.Helper()
	c, err := admission.New(admission.WithClasses(
		admission.Class{Name: "work", Slots: 1, QueueItems: 4},
		admission.Class{Name: "other", Slots: 1}),
		admission.WithDefaultClass("work"), admission.WithMethods("other", "/demo.Other/"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	p, err := c.AdmitAt(context.Background(), work("/demo.W/Do"), t0)
	require.NoError(t, err)
	p.ReleaseAt(t0)
	return c, t0
}

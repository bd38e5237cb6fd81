package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

// Permit.Release, ReleaseMissCounted and Abandon, the forms without a time,
// read the controller's clock (the wall clock) even while the controller is
// driven on a virtual clock (its last admission an AdmitAt): one plain
// Release in a simulation set in 2020 brought the controller up to the
// wall clock, expiring an override set for an hour of virtual time (and
// closing years of degradation windows). They act at the latest time the
// caller gave, as Stats, Mode and the other plain forms do.
func TestPlainEndOfAPermitDoesNotMoveAVirtualClock(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(p *admission.Permit)
	}{
		{"Release", (*admission.Permit).Release},
		{"ReleaseMissCounted", (*admission.Permit).ReleaseMissCounted},
		{"Abandon", (*admission.Permit).Abandon},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, t0 := virtualCtl(t)
			ctx := context.Background()
			_, err := c.SetOverrideAt(ctx, admission.Override{Actor: "test", Reason: "freeze for an hour", Class: "other", Freeze: true, TTL: time.Hour}, t0)
			require.NoError(t, err)
			p, err := c.AdmitAt(ctx, work("/demo.W/Do"), t0.Add(time.Second))
			require.NoError(t, err)

			tc.end(p)

			require.Len(t, c.OverridesAt(t0.Add(time.Hour-time.Nanosecond)), 1,
				"an override set for an hour of virtual time was expired by the wall clock")
			_, err = c.AdmitAt(ctx, work("/demo.Other/Do"), t0.Add(2*time.Second))
			require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason,
				"the freeze, set for an hour of virtual time, was expired by the wall clock: %v", err)
			// The slot was returned all the same.
			require.Zero(t, workStats(t, c.StatsAt(t0.Add(2*time.Second))).Running)
			require.Empty(t, c.OverridesAt(t0.Add(time.Hour)))
		})
	}
}

// A plain Release on a virtual clock has no end time of its own: the
// latest time the caller gave is the earliest the work can have ended
// (times go forward), so a service time measured to it is only a lower
// bound (zero for a release right after the admission), and one measured
// to the wall clock is years. It teaches the class no service time; it
// still returns the slot, and counts a late finish only when the latest
// time given is already past the deadline.
func TestPlainReleaseOnAVirtualClockTeachesNoServiceTime(t *testing.T) {
	newVirtual := func(t *testing.T) (*admission.Controller, time.Time) {
		c, err := admission.New(admission.WithClasses(
			admission.Class{Name: "work", Slots: 2, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}),
			admission.WithDefaultClass("work"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c, time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		end  func(p *admission.Permit)
	}{
		{"Release", (*admission.Permit).Release},
		{"ReleaseMissCounted", (*admission.Permit).ReleaseMissCounted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, t0 := newVirtual(t)
			before := workStats(t, c.StatsAt(t0))
			r := work("/demo.W/Do")
			r.Deadline = t0.Add(10 * time.Second)
			p, err := c.AdmitAt(ctx, r, t0)
			require.NoError(t, err)
			tc.end(p) // right after: at t0
			s := workStats(t, c.StatsAt(t0))
			require.Equal(t, before.ServiceMean, s.ServiceMean, "a plain Release on a virtual clock taught a service time")
			require.Equal(t, before.ServiceP95, s.ServiceP95)
			require.Zero(t, s.FalseAccepts, "the work may well have finished by its deadline, ten virtual seconds on")
			require.Zero(t, s.Running)

			// Past the deadline by the caller's latest time: surely late.
			r.Deadline = t0.Add(time.Second)
			p, err = c.AdmitAt(ctx, r, t0)
			require.NoError(t, err)
			q, err := c.AdmitAt(ctx, work("/demo.W/Do"), t0.Add(5*time.Second))
			require.NoError(t, err)
			tc.end(p)
			s = workStats(t, c.StatsAt(t0.Add(5*time.Second)))
			require.Equal(t, before.ServiceMean, s.ServiceMean)
			require.EqualValues(t, 1, s.FalseAccepts)
			q.ReleaseAt(t0.Add(5*time.Second + 50*time.Millisecond))
			require.NotEqual(t, before.ServiceMean, workStats(t, c.StatsAt(t0.Add(6*time.Second))).ServiceMean,
				"ReleaseAt, with its own time, still teaches")
		})
	}

	// A permit whose start was a time the caller gave, released plainly
	// after an Admit returned the controller to the wall clock: its
	// service time would run from 2020 to now. It teaches nothing either.
	t.Run("started virtual, released real", func(t *testing.T) {
		c, t0 := newVirtual(t)
		before := workStats(t, c.StatsAt(t0))
		p, err := c.AdmitAt(ctx, work("/demo.W/Do"), t0)
		require.NoError(t, err)
		q, err := c.Admit(ctx, work("/demo.W/Do"))
		require.NoError(t, err)
		p.Release()
		require.Equal(t, before.ServiceMean, workStats(t, c.Stats()).ServiceMean,
			"a permit started on a virtual clock taught its service time to the wall clock")
		q.Release() // both ends on the wall clock: teaches
		require.NotEqual(t, before.ServiceMean, workStats(t, c.Stats()).ServiceMean)
	})
}

// The tap compared the wall clock with the due time of a virtual
// controller's state (an override's expiry, a window's end, both in the
// caller's time) and brought the controller up to the wall clock: one
// stream arriving expired every override of the simulation. It follows the
// rule of the plain forms: on a virtual clock its time is the latest the
// caller gave.
func TestTapDoesNotMoveAVirtualClock(t *testing.T) {
	c, t0 := virtualCtl(t)
	ctx := context.Background()
	_, err := c.SetOverrideAt(ctx, admission.Override{Actor: "test", Reason: "freeze for an hour", Class: "other", Freeze: true, TTL: time.Hour}, t0)
	require.NoError(t, err)

	_, err = c.TapHandle(ctx, &tap.Info{FullMethodName: "/demo.Other/Do"})
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason,
		"the tap expired the freeze, set for an hour of virtual time, by the wall clock: %v", err)
	require.Len(t, c.OverridesAt(t0.Add(time.Hour-time.Nanosecond)), 1)
	require.Empty(t, c.OverridesAt(t0.Add(time.Hour)))
	_, err = c.TapHandle(ctx, &tap.Info{FullMethodName: "/demo.Other/Do"})
	require.NoError(t, err, "the freeze has ended at the caller's time")
}

// The tap let a stream of a full class through once the wall clock passed
// the time by which the queue's earliest waiter can no longer finish: on
// a virtual clock that time is the caller's, and by the caller's latest
// time the waiter can still finish, so Admit would refuse the stream
// QUEUE_FULL; the tap refuses it too.
func TestTapHopelessWaiterOnAVirtualClock(t *testing.T) {
	c, err := admission.New(admission.WithClasses(
		admission.Class{Name: "work", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	p, err := c.AdmitAt(ctx, work("/demo.W/Do"), t0)
	require.NoError(t, err)
	r := work("/demo.W/Do")
	r.Deadline = t0.Add(10 * time.Second)
	type res struct {
		p   *admission.Permit
		err error
	}
	done := make(chan res, 1)
	go func() {
		q, err := c.AdmitAt(ctx, r, t0)
		done <- res{q, err}
	}()
	require.Eventually(t, func() bool { return workStats(t, c.StatsAt(t0)).Queued == 1 }, 5*time.Second, time.Millisecond)

	_, err = c.TapHandle(ctx, &tap.Info{FullMethodName: "/demo.W/Do"})
	require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(err).Reason,
		"the waiter can finish by the caller's time; the tap judged it by the wall clock: %v", err)
	_, err = c.AdmitAt(ctx, work("/demo.W/Do"), t0)
	require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(err).Reason, "Admit agrees")

	p.ReleaseAt(t0.Add(time.Second))
	got := <-done
	require.NoError(t, got.err)
	got.p.ReleaseAt(t0.Add(2 * time.Second))
}

// workStats is the stats of class "work" in st.
func workStats(t *testing.T, st admission.Stats) admission.ClassStats {
	t.Helper()
	for _, cl := range st.Classes {
		if cl.Name == "work" {
			return cl
		}
	}
	t.Fatal("no class work")
	return admission.ClassStats{}
}

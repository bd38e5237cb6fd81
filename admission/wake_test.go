package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Found with TestCollectDoesNotMoveAVirtualClock: on the real clock the
// controller arms a timer of its own, while requests wait, for when time
// alone changes its state (here an override's expiry). Driven on a virtual
// clock (AdmitAt), that expiry lay years before the wall clock: the timer
// fired at once and brought the controller up to the wall clock, expiring
// an override set for an hour of virtual time. A virtual clock's time is
// its caller's to give.
func TestWakeTimerDoesNotMoveAVirtualClock(t *testing.T) {
	c, p, t0, cancel, waited := virtualWaiter(t)
	_, err := c.SetOverrideAt(context.Background(), admission.Override{
		Actor: "test", Reason: "freeze for an hour of virtual time", Class: "other", Freeze: true, TTL: time.Hour,
	}, t0)
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond) // the timer, armed for a past instant, would have fired

	_, err = c.AdmitAt(context.Background(), work("/demo.Other/Do"), t0.Add(time.Second))
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason, "the override was expired by the wall clock")

	cancel()
	<-waited
	p.ReleaseAt(t0.Add(2 * time.Second))
}

// A review found that the virtual flag, set by one AdmitAt, was never cleared, so a
// real-clock controller that is also driven with Admit (the interceptor's
// path) stopped arming its wake timer for good. A waiter that only time can
// start (an override that lowered the slots expires) then waited until its
// own context ended, although nothing else is queued or running against it.
func TestOneAdmitAtDoesNotStopTheWakeTimerForAdmit(t *testing.T) {
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 2, QueueItems: 4}),
		admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	// One call at an explicit time, which is the wall clock's.
	p0, err := c.AdmitAt(context.Background(), work("/demo.W/Do"), time.Now())
	require.NoError(t, err)
	p0.ReleaseAt(time.Now())

	_, err = c.SetOverride(context.Background(), admission.Override{
		Actor: "test", Reason: "one slot for 100 ms", Class: "work", Slots: 1, TTL: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	p1, err := c.Admit(context.Background(), work("/demo.W/Do"))
	require.NoError(t, err)
	defer p1.Release()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	p2, err := c.Admit(ctx, work("/demo.W/Do")) // waits: one slot in force
	require.NoError(t, err, "the override expired after 100 ms, yet the waiter was never started")
	require.Less(t, time.Since(start), time.Second)
	p2.Release()
}

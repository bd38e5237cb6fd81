package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// On the real clock the README promises a waiter is dropped "by its own
// timer the moment its deadline less the service estimate passes". Its
// timer was armed with the estimate when it joined and re-read it only when
// it fired, so a waiter that a release's higher estimate made hopeless a
// little later stayed queued — its caller unanswered, its place held —
// until its deadline less the OLD estimate.
//
// B (2 slots, expected 10ms, learning rate 1) runs b1, b2; W_A (no deadline)
// and W_D (deadline t0+2s) wait. b2 is released at t0+0.75s: B learns
// ~0.75s, W_D (t0+1.5s ≤ t0+2s) is not yet hopeless and W_A takes the slot.
// W_D is hopeless from ~t0+1.25s; the old timer fired at ~t0+1.99s. At
// t0+1.6s (some 0.35s from either) it must have been dropped. Real time is
// what the timers run on.
func TestRegression12GiveUpTimerFollowsARisingEstimate(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(
		admission.Class{Name: "B", Slots: 2, QueueItems: 2, ExpectedServiceTime: 10 * time.Millisecond, MaxServiceTime: time.Hour}),
		admission.WithDefaultClass("B"),
		admission.WithLearningRate(1),
		admission.WithStages(admission.AllStages&^admission.StageDegradation))
	require.NoError(t, err)
	defer ctrl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Now()
	b1, err := ctrl.Admit(ctx, work("/demo.B/Do"))
	require.NoError(t, err)
	defer b1.Abandon()
	b2, err := ctrl.Admit(ctx, work("/demo.B/Do"))
	require.NoError(t, err)

	type res struct {
		p   *admission.Permit
		err error
	}
	wa, wd := make(chan res, 1), make(chan res, 1)
	go func() { p, err := ctrl.Admit(ctx, work("/demo.B/Do")); wa <- res{p, err} }()
	waitQueued(t, ctrl, "B", 1)
	rd := work("/demo.B/Do")
	rd.Deadline = t0.Add(2 * time.Second)
	go func() { p, err := ctrl.Admit(ctx, rd); wd <- res{p, err} }()
	waitQueued(t, ctrl, "B", 2)

	time.Sleep(time.Until(t0.Add(750 * time.Millisecond)))
	b2.Release() // B learns ~0.75s; W_A starts on the freed slot
	r := <-wa
	require.NoError(t, r.err)
	defer r.p.Abandon()

	time.Sleep(time.Until(t0.Add(1600 * time.Millisecond)))
	select {
	case r := <-wd:
		require.Error(t, r.err)
	default:
		st, _ := ctrl.Stats().Class("B")
		t.Fatalf("at t0+1.6s W_D (deadline t0+2s, estimate %v since t0+0.75s) is still queued (B queued %d): its timer was armed with the 10ms estimate",
			750*time.Millisecond, st.Queued)
	}
}

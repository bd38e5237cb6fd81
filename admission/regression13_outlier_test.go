package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A fresh class (ExpectedServiceTime 10ms) serves 5 requests of 10ms; the
// 6th hangs until the default MaxServiceTime cap (1 min). The estimator
// clips outliers only after clipMinSamples (20) observations, so this one
// moves the mean to ≈12s and the p95 up by 0.95·(mean/10) ≈ 1.15s. The
// class then serves 1000 more requests, every one taking exactly 10ms: the
// mean is back at 10ms, but the p95 only steps down by 0.05·(mean/10) =
// 50µs per observation, so service() = max(p95, mean) still says ≈0.8s
// after 1006 samples of which 1005 took 10ms (their real p95: 10ms). Every
// request that does not find the class idle is refused
// DEADLINE_UNREACHABLE with a 500ms deadline — even with no wait at all —
// for about 16,000 more requests: one hung handler early in a process's
// life locks the class out of all but idle-class probes.
func TestRegression13EarlyOutlierLocksClassOut(t *testing.T) {
	clk := newClock()
	ctrl, err := admission.New(admission.WithClock(clk.Now),
		admission.WithClasses(admission.Class{Name: "main", Slots: 4, QueueItems: 4, ExpectedServiceTime: 10 * time.Millisecond}))
	require.NoError(t, err)
	defer ctrl.Close()
	ctx := context.Background()
	serve := func(d time.Duration) {
		p, err := ctrl.AdmitAt(ctx, work("/demo.Main/Do"), clk.Now())
		require.NoError(t, err)
		p.ReleaseAt(clk.Advance(d))
	}
	for range 5 {
		serve(10 * time.Millisecond)
	}
	serve(time.Minute) // one hung handler, at the cap
	for range 1000 {
		serve(10 * time.Millisecond)
	}
	// One request runs (the class is not idle); a second, with 500ms to go
	// and a free slot, needs no wait.
	p1, err := ctrl.AdmitAt(ctx, work("/demo.Main/Do"), clk.Now())
	require.NoError(t, err)
	defer p1.AbandonAt(clk.Now())
	r := work("/demo.Main/Do")
	r.Deadline = clk.Now().Add(500 * time.Millisecond)
	p2, err := ctrl.AdmitAt(ctx, r, clk.Now())
	if err != nil {
		st, _ := ctrl.StatsAt(clk.Now()).Class("main")
		t.Fatalf("1005 of the last 1006 requests took 10ms, a slot is free, 500ms to go, yet refused %v (estimate: mean %v, p95 %v)",
			status.ReasonName(status.OutcomeOf(err).Reason), st.ServiceMean, st.ServiceP95)
	}
	p2.AbandonAt(clk.Now())
}

package admission_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A stationary bimodal service: 90% of requests take 10–12 ms, 10% take
// 100–120 ms, so the p95 is 110 ms and it never changes. A run of 30 fast
// requests in a row comes about once in 25 runs (0.9³⁰ ≈ 0.04), with no
// hang and nothing cut: it says nothing of the p95, and must not take it
// down to the fast mode's 12 ms (which makes every slow request with a
// deadline under 110 ms away a false accept).
func bimodal(r *rand.Rand) time.Duration {
	if r.Float64() < 0.9 {
		return time.Duration(10e6 * (1 + 0.2*r.Float64()))
	}
	return time.Duration(100e6 * (1 + 0.2*r.Float64()))
}

func newBimodal(t *testing.T) *admission.Controller {
	t.Helper()
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "b", Slots: 4, ExpectedServiceTime: 20 * time.Millisecond}),
		admission.WithDefaultClass("b"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ctrl.Close()) })
	return ctrl
}

func TestR18qAStationaryBimodalServiceKeepsItsP95(t *testing.T) {
	ctrl := newBimodal(t)
	r := rand.New(rand.NewPCG(18, 17))
	now := epoch
	var p95s []time.Duration
	for i := range 6000 {
		p, err := ctrl.AdmitAt(context.Background(), admission.Request{Method: "/b.B/Do", Size: -1, Deadline: now.Add(10 * time.Second)}, now)
		require.NoError(t, err)
		now = now.Add(bimodal(r))
		p.ReleaseAt(now)
		if i >= 1000 {
			st, _ := ctrl.Stats().Class("b")
			p95s = append(p95s, st.ServiceP95)
		}
	}
	slices.Sort(p95s)
	n := len(p95s)
	t.Logf("learned p95 of a 110 ms p95: 1st percentile %v, 10th %v, median %v", p95s[n/100], p95s[n/10], p95s[n/2])
	require.GreaterOrEqual(t, p95s[n/100], 55*time.Millisecond,
		"a stationary workload's p95 never falls below half of its true 110 ms for more than 1%% of its samples")
}

// The same service, with deadlines from 55 to 220 ms away: a false accept
// (admitted, then cut by its deadline) is a slow request admitted with
// less than its time left, which a p95 that learned the slow mode refuses.
// The pre-r18 estimator made 0.62% of the admitted false accepts in this
// run's model (internal estimatebias test), the r18 one 2.5%.
func TestR18qAStationaryBimodalServiceKeepsFalseAcceptsRare(t *testing.T) {
	ctrl := newBimodal(t)
	r := rand.New(rand.NewPCG(5, 6))
	now := epoch
	// One long request keeps the class busy, so that the deadline stage
	// plans with the learned estimate (an idle class only probes).
	busy, err := ctrl.AdmitAt(context.Background(), admission.Request{Method: "/b.B/Do", Size: -1}, now)
	require.NoError(t, err)
	for i := range 30000 {
		svc := bimodal(r)
		budget := time.Duration(110e6 * (0.5 + 1.5*r.Float64()))
		if i < 1000 {
			budget = 10 * time.Second // warm up
		}
		p, err := ctrl.AdmitAt(context.Background(), admission.Request{Method: "/b.B/Do", Size: -1, Deadline: now.Add(budget)}, now)
		if err != nil {
			var se *status.Error
			require.True(t, errors.As(err, &se), "%v", err)
			require.Equal(t, status.ReasonDeadlineUnreachable, se.Reason())
			now = now.Add(time.Millisecond)
			continue
		}
		now = now.Add(min(svc, budget+time.Millisecond)) // cut just after its deadline
		p.ReleaseAt(now)
	}
	busy.AbandonAt(now)
	st, _ := ctrl.Stats().Class("b")
	t.Logf("admitted %d, false accepts %d (%.2f%%), false rejects %d, final p95 %v",
		st.Admitted, st.FalseAccepts, 100*float64(st.FalseAccepts)/float64(st.Admitted), st.FalseRejects, st.ServiceP95)
	require.Less(t, float64(st.FalseAccepts), 0.01*float64(st.Admitted), "false accepts stay under 1%% of the admitted")
}

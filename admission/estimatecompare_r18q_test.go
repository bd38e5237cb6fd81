package admission

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// preR18Estimator is the estimator as it was before r18 (65d7a20): no
// censored samples, no run of samples below the p95 taking it down.
type preR18Estimator struct{ mean, p95, alpha, cap float64 }

func (e *preR18Estimator) observe(d time.Duration, n uint64) {
	x := min(float64(max(d, 0)), e.cap)
	if n >= clipMinSamples && e.p95 > 0 && x > clipFactor*e.p95 {
		x = clipFactor * e.p95
	}
	if n == 0 && e.mean == 0 {
		e.mean, e.p95 = x, x
		return
	}
	e.mean += e.alpha * (x - e.mean)
	step := max(max(e.mean, e.p95)*0.1, 1)
	switch {
	case x > e.p95:
		e.p95 = min(e.p95+0.95*step, x)
	case x < e.p95:
		e.p95 = max(e.p95-0.05*step, x)
	}
}

// Side by side, on the same seeded stream of a stationary service: a
// request is admitted when its deadline is at least the planned service
// time away (a busy class, no wait), and one that takes longer than its
// deadline allows is cut just after it (a false accept, learned as a
// censored sample). Since nothing changes, the p95 should plan as it did
// before r18: the settling run exists for a p95 that cut handlers raised
// (a hang), and must not trim a stationary p95's upper swings, nor take a
// bimodal one down to its fast mode.
func TestR18qStationaryServiceFalseAcceptsAsBeforeR18(t *testing.T) {
	for _, tc := range []struct {
		name string
		svc  func(*rand.Rand) float64
		p95  float64
	}{
		{"lognormal σ=1", func(r *rand.Rand) float64 { return 20e6 * math.Exp(r.NormFloat64()) }, 20e6 * math.Exp(1.645)},
		{"exponential", func(r *rand.Rand) float64 { return 20e6 * r.ExpFloat64() }, 20e6 * 3},
		{"bimodal 90/10", func(r *rand.Rand) float64 {
			if r.Float64() < 0.9 {
				return 10e6 * (1 + 0.2*r.Float64())
			}
			return 100e6 * (1 + 0.2*r.Float64())
		}, 110e6},
	} {
		old := preR18Estimator{alpha: 0.1, cap: float64(DefaultMaxServiceTime)}
		cur := newEstimator(0, DefaultMaxServiceTime, 0.1)
		type tally struct{ admitted, falseAccepts int }
		var to, tc2 tally
		run := func(tl *tally, service func() float64, learn func(d float64, i int, cut bool)) {
			r := rand.New(rand.NewPCG(5, 6))
			for i := range 200000 {
				s := tc.svc(r)
				slack := tc.p95 * (0.5 + 1.5*r.Float64())
				if i < 1000 {
					slack = math.Inf(1) // warm up
				}
				if slack < service() {
					continue
				}
				tl.admitted++
				if s > slack {
					tl.falseAccepts++
					learn(slack+1e6, i, true)
				} else {
					learn(s, i, false)
				}
			}
		}
		var n uint64
		run(&to, func() float64 { return max(old.mean, old.p95) }, func(d float64, _ int, _ bool) { old.observe(time.Duration(d), n); n++ })
		run(&tc2, func() float64 { return float64(cur.service()) }, func(d float64, i int, cut bool) { cur.observe(time.Duration(d), float64(i), cut) })
		t.Logf("%-14s before r18: %d admitted, %d false accepts (%.2f%%); now: %d admitted, %d false accepts (%.2f%%)", tc.name,
			to.admitted, to.falseAccepts, 100*float64(to.falseAccepts)/float64(to.admitted),
			tc2.admitted, tc2.falseAccepts, 100*float64(tc2.falseAccepts)/float64(tc2.admitted))
		if float64(tc2.falseAccepts) > 1.05*float64(to.falseAccepts)+20 {
			t.Errorf("%s: %d false accepts, %d before r18", tc.name, tc2.falseAccepts, to.falseAccepts)
		}
	}
}

package admission

import "time"

// estimator learns a class's service time: an exponentially weighted mean
// and a streaming p95 (a frugal quantile estimate: it moves up by 0.95 of a
// step on an observation above it and down by 0.05 of a step below it, so it
// settles where 5% of observations lie above). The step is a tenth of the
// larger of the two, so a p95 that one slow sample raised far above the mean
// comes down geometrically (by half in about 140 ordinary samples), not by a
// tenth of the mean at a time. Both start from the class's
// ExpectedServiceTime. Every observation is capped at MaxServiceTime (default
// DefaultMaxServiceTime) and, once clipMinSamples observations were made, at
// clipFactor times the current p95, so one huge sample (a hung handler) moves
// the estimate by a bounded step instead of locking the class out. An
// earlier one is not clipped (the first samples may correct a seed far too
// low): it raises the p95 by one step, which comes down as above.
// Planning uses the larger of the mean and the p95 (service); Stats reports
// the p95 as at least the mean until clipMinSamples observations (p95D).
// Not safe for concurrent use: the controller's lock guards it.
type estimator struct {
	mean, p95 float64 // nanoseconds
	n         uint64
	alpha     float64
	cap       float64
}

const (
	clipMinSamples = 20
	clipFactor     = 4
)

func newEstimator(seed, capd time.Duration, alpha float64) estimator {
	return estimator{mean: float64(seed), p95: float64(seed), alpha: alpha, cap: float64(capd)}
}

func (e *estimator) observe(d time.Duration) {
	x := float64(max(d, 0))
	if e.cap > 0 && x > e.cap {
		x = e.cap
	}
	if e.n >= clipMinSamples && e.p95 > 0 && x > clipFactor*e.p95 {
		x = clipFactor * e.p95
	}
	e.n++
	if e.n == 1 && e.mean == 0 {
		e.mean, e.p95 = x, x
		return
	}
	e.mean += e.alpha * (x - e.mean)
	step := max(max(e.mean, e.p95)*0.1, 1)
	switch {
	case x > e.p95:
		e.p95 += 0.95 * step
		if e.p95 > x {
			e.p95 = x
		}
	case x < e.p95:
		e.p95 -= 0.05 * step
		if e.p95 < x {
			e.p95 = x
		}
	}
	if e.cap > 0 && e.p95 > e.cap {
		e.p95 = e.cap
	}
}

// p95D is the learned p95 service time as Stats reports it: while fewer
// than clipMinSamples observations were made, at least the mean. The p95
// starts from the seed and climbs by a step per slower sample, so the first
// samples above a low seed leave it under the mean of the same evidence
// (seed 50 ms, three samples of 200 ms: mean 123 ms, p95 79 ms), which no
// 95th percentile is; the deadline stage plans with the larger of the two
// anyway (service).
func (e *estimator) p95D() time.Duration {
	if e.n < clipMinSamples {
		return time.Duration(max(e.p95, e.mean))
	}
	return time.Duration(e.p95)
}

// meanD is the learned mean service time.
func (e *estimator) meanD() time.Duration { return time.Duration(e.mean) }

// unknown reports whether nothing is known of the service time: no seed
// (ExpectedServiceTime) and no observation.
func (e *estimator) unknown() bool { return e.n == 0 && e.mean == 0 && e.p95 == 0 }

// service is the service time the deadline stage plans with: the larger of
// the p95 and the mean.
func (e *estimator) service() time.Duration { return time.Duration(max(e.p95, e.mean)) }

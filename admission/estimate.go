package admission

import "time"

// estimator learns a class's service time: an exponentially weighted mean
// and a streaming p95 (a frugal quantile estimate: it moves up by 0.95 of a
// step on an observation above it and down by 0.05 of a step below it, so it
// settles where 5% of observations lie above). The step is a tenth of the
// larger of the two, so a p95 that one slow sample raised far above the mean
// comes down geometrically (by half in about 140 ordinary samples), not by a
// tenth of the mean at a time. Work that ended after its deadline is a
// censored sample (observe's cut): it may raise the p95, never lower it.
// A p95 that cut samples raised (a hang whose handlers its callers' deadlines
// cut) would outlive the hang by hundreds of samples — samples the refusals
// it causes would withhold — so settleRun completed samples in a row below
// the p95 take it down at once to what completed work bears out, the larger
// of the run's largest sample and done (the p95 of completed samples alone),
// when the p95 is at least settleFactor times that. Under a stationary
// service the p95 is hardly ever so far above done, and a run below it, which
// comes about once in five runs (in 25 for a bimodal service whose slow mode
// is a tenth), leaves it as it is: its largest lies near the 92nd
// percentile, or in the fast mode, and taking the p95 down to it would
// trim the p95's upper swings and turn slow requests into false accepts.
// Both start from the class's
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
	// done is the p95 of completed samples alone (cut ones left out), as
	// p95 moves on them: what the p95 would be had no cut sample raised it.
	done  float64
	n     uint64
	alpha float64
	cap   float64
	// below counts the completed samples in a row that lay below the p95
	// (since the last one at or above it, or cut), belowMax the largest,
	// belowFrom the earliest start among them (ns since the controller's
	// epoch).
	below               int
	belowMax, belowFrom float64
}

const (
	clipMinSamples = 20
	clipFactor     = 4
	// settleRun is how many completed samples in a row below the p95 may
	// take it down to what completed work bears out (observe). Were the
	// p95 right, so long a run would come about one time in five
	// (0.95^30 ≈ 0.21), so it takes the p95 down only when it is at least
	// settleFactor times that: stale, as cut samples leave it, not a
	// stationary p95's swing.
	settleRun    = 30
	settleFactor = 2
)

func newEstimator(seed, capd time.Duration, alpha float64) estimator {
	return estimator{mean: float64(seed), p95: float64(seed), done: float64(seed), alpha: alpha, cap: float64(capd)}
}

// observe learns one service time d of work that started at start (ns since
// the controller's epoch). cut marks a censored sample: the work ended
// after its deadline (its handler was cut by it, or ran late), so its
// service time was at least d. It teaches the mean as d (a lower bound) and
// raises the p95 as any sample above it does, since the true time lay above
// it too; but it never lowers the p95 (the true time may lie above it), and
// it ends a run of samples below the p95 unless it started no later than all of
// them (then it is older news than the run: work that started later
// completed in less).
func (e *estimator) observe(d time.Duration, start float64, cut bool) {
	x := float64(max(d, 0))
	if e.cap > 0 && x > e.cap {
		x = e.cap
	}
	if e.n >= clipMinSamples && e.p95 > 0 && x > clipFactor*e.p95 {
		x = clipFactor * e.p95
	}
	e.n++
	if e.n == 1 && e.mean == 0 {
		e.mean, e.p95, e.done = x, x, x
		return
	}
	e.mean += e.alpha * (x - e.mean)
	if !cut {
		step := max(max(e.mean, e.done)*0.1, 1)
		switch {
		case x > e.done:
			e.done = min(e.done+0.95*step, x)
		case x < e.done:
			e.done = max(e.done-0.05*step, x)
		}
	}
	step := max(max(e.mean, e.p95)*0.1, 1)
	stale := cut && e.below > 0 && start <= e.belowFrom
	switch {
	case x > e.p95:
		e.p95 += 0.95 * step
		if e.p95 > x {
			e.p95 = x
		}
		if !stale {
			e.below, e.belowMax = 0, 0
		}
	case cut:
		if !stale {
			e.below, e.belowMax = 0, 0
		}
	case x < e.p95:
		e.p95 -= 0.05 * step
		if e.p95 < x {
			e.p95 = x
		}
		if e.below == 0 || start < e.belowFrom {
			e.belowFrom = start
		}
		e.below++
		e.belowMax = max(e.belowMax, x)
		if e.below >= settleRun {
			// So many samples in a row below it, with the p95 far above
			// what completed work bears out, say it is stale (a hang's
			// cut handlers raised it): the larger of the run's largest and
			// done is a p95 the recent work bears out.
			if bears := max(e.belowMax, e.done); e.p95 >= settleFactor*bears {
				e.p95 = bears
			}
			e.below, e.belowMax = 0, 0
		}
	default:
		e.below, e.belowMax = 0, 0
	}
	if e.cap > 0 && e.p95 > e.cap {
		e.p95 = e.cap
	}
	if e.cap > 0 && e.done > e.cap {
		e.done = e.cap
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

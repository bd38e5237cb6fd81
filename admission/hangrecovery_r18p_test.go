package admission_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// An SRE's storm test found that after a dependency hang the dependency's
// own admission kept refusing healthy traffic, DEADLINE_UNREACHABLE, for
// seconds: the handlers its callers cut at their per-try timeouts were
// learned as service times, lifting the p95 from 21 ms to several hundred,
// and the p95 came down by half only every ~140 samples — while the very
// refusals it caused starved it of samples (only an idle class's probe got
// through). Its own false-reject count said the refusals were wrong.

const hangM = "/dep.Dep/Work"

// hangRun counts what a class at 20 ms (8 slots, no queue) refused in a
// run on a virtual clock: a 220 ms-deadline request every 10 ms (a first
// try's share of its caller's budget) and a 700 ms one every 50 ms (a
// later try's); from 2 s to 4 s every handler that starts hangs until its
// deadline cuts it (it ends just after it, as a cancelled handler does).
type hangRun struct {
	hangRefused, hangAdmitted int // 220 ms requests arriving 2.5–4 s
	// 220 ms requests refused DEADLINE_UNREACHABLE arriving from 4 s, and
	// from 4.7 s, when the last handler the hang held has been cut.
	afterHang, recoveryRefused int
	lastRefusal                time.Duration
	stats                      admission.ClassStats
}

func runHang(t *testing.T) hangRun {
	t.Helper()
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "dep", Slots: 8, ExpectedServiceTime: 20 * time.Millisecond}),
		admission.WithDefaultClass("dep"))
	require.NoError(t, err)
	defer func() { require.NoError(t, ctrl.Close()) }()

	type run struct {
		p   *admission.Permit
		end time.Time
	}
	var running []run
	var out hangRun
	ctx := context.Background()
	for ms := 0; ms < 8000; ms += 10 {
		now := epoch.Add(time.Duration(ms) * time.Millisecond)
		slices.SortFunc(running, func(a, b run) int { return a.end.Compare(b.end) })
		for len(running) > 0 && !running[0].end.After(now) {
			running[0].p.ReleaseAt(running[0].end)
			running = running[1:]
		}
		budgets := []time.Duration{220 * time.Millisecond}
		if ms%50 == 0 {
			budgets = append(budgets, 700*time.Millisecond)
		}
		for _, b := range budgets {
			r := admission.Request{Method: hangM, Size: -1, Deadline: now.Add(b)}
			p, err := ctrl.AdmitAt(ctx, r, now)
			short := b == 220*time.Millisecond
			if err != nil {
				var se *status.Error
				require.True(t, errors.As(err, &se), "%v", err)
				if short && ms >= 2500 && ms < 4000 {
					out.hangRefused++
				}
				if short && ms >= 4000 && se.Reason() == status.ReasonDeadlineUnreachable {
					out.afterHang++
					out.lastRefusal = time.Duration(ms) * time.Millisecond
					if ms >= 4700 {
						out.recoveryRefused++
					}
				}
				continue
			}
			if short && ms >= 2500 && ms < 4000 {
				out.hangAdmitted++
			}
			end := now.Add(20 * time.Millisecond)
			if ms >= 2000 && ms < 4000 {
				end = r.Deadline.Add(time.Millisecond) // hung: cut by its deadline
			}
			running = append(running, run{p, end})
		}
	}
	for _, r := range running {
		r.p.ReleaseAt(r.end)
	}
	out.stats, _ = ctrl.Stats().Class("dep")
	return out
}

func TestR18pRecoversSoonAfterAHangOfCutHandlers(t *testing.T) {
	r := runHang(t)
	t.Logf("hang 2.5–4 s: %d of the 220 ms requests refused, %d admitted; from 4 s: %d refused DEADLINE_UNREACHABLE, %d of them from 4.7 s, the last at %v; false rejects %d; final mean %v p95 %v",
		r.hangRefused, r.hangAdmitted, r.afterHang, r.recoveryRefused, r.lastRefusal, r.stats.FalseRejects, r.stats.ServiceMean, r.stats.ServiceP95)
	// The deadline-aware promise during the hang: a request that would be
	// cut is refused early (the slots are held by hung handlers; the
	// 220 ms requests are refused, not admitted to be cut).
	require.Greater(t, r.hangRefused, 10*r.hangAdmitted, "during the hang nearly every 220 ms request is refused early")
	// After it the service takes 20 ms again, but the slots stay held by
	// the hung handlers until their deadlines cut them (the last at
	// 4.7 s). From then on, 20 ms samples come only from the idle
	// class's probes and the 700 ms requests, about 70 a second; the
	// refusals stop once a run of them has shown the p95 stale, within
	// half a second, not seconds.
	require.Less(t, r.recoveryRefused, 50, "refused %d healthy 220 ms requests after the hang's handlers ended", r.recoveryRefused)
}

// learnCut teaches class "dep" of ctrl n handlers cut by their budget-long
// deadlines (each ends just after it), one after another from now; it
// returns the time the last one ended.
func learnCut(t *testing.T, ctrl *admission.Controller, now time.Time, budget time.Duration, n int) time.Time {
	t.Helper()
	for range n {
		p, err := ctrl.AdmitAt(context.Background(), admission.Request{Method: hangM, Size: -1, Deadline: now.Add(budget)}, now)
		require.NoError(t, err)
		now = now.Add(budget + time.Millisecond)
		p.ReleaseAt(now)
	}
	return now
}

func newDep(t *testing.T, slots int) *admission.Controller {
	t.Helper()
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "dep", Slots: slots, ExpectedServiceTime: 20 * time.Millisecond}),
		admission.WithDefaultClass("dep"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ctrl.Close()) })
	return ctrl
}

// A handler that hung since before the recovery and is cut after work that
// started later has completed quickly is older news than that work: it does
// not keep the p95 up.
func TestR18pAHandlerCutLateDoesNotHoldTheP95Up(t *testing.T) {
	ctrl := newDep(t, 8)
	now := learnCut(t, ctrl, epoch, 300*time.Millisecond, 40)
	st, _ := ctrl.Stats().Class("dep")
	require.Greater(t, st.ServiceP95, 250*time.Millisecond, "the cut handlers taught the hang")

	hung, err := ctrl.AdmitAt(context.Background(), admission.Request{Method: hangM, Size: -1, Deadline: now.Add(time.Second)}, now)
	require.NoError(t, err)
	hungEnd := now.Add(time.Second + time.Millisecond)
	fast := func() {
		t.Helper()
		p, err := ctrl.AdmitAt(context.Background(), admission.Request{Method: hangM, Size: -1, Deadline: now.Add(time.Second)}, now)
		require.NoError(t, err)
		now = now.Add(20 * time.Millisecond)
		p.ReleaseAt(now)
	}
	for range 29 {
		fast()
	}
	hung.ReleaseAt(hungEnd) // cut by its deadline, after the 29 that started later
	now = hungEnd
	fast()
	st, _ = ctrl.Stats().Class("dep")
	require.Equal(t, 20*time.Millisecond, st.ServiceP95, "30 samples in a row at 20 ms, all started after the cut handler")
}

// The deadline-aware promise in a real slowdown: work that completes takes
// 300 ms, and the 220 ms requests an idle class lets through as probes are
// cut by their deadlines. Their times are lower bounds: they do not bring
// the p95 down to them, however many, and a 220 ms request is refused
// early while the class is busy.
func TestR18pCutHandlersDoNotLowerTheP95OfARealSlowdown(t *testing.T) {
	ctrl := newDep(t, 2)
	now := epoch
	for range 40 { // the slowdown, learned from work that completed
		p, err := ctrl.AdmitAt(context.Background(), admission.Request{Method: hangM, Size: -1, Deadline: now.Add(time.Second)}, now)
		require.NoError(t, err)
		now = now.Add(300 * time.Millisecond)
		p.ReleaseAt(now)
	}
	now = learnCut(t, ctrl, now, 220*time.Millisecond, 60) // idle probes, each cut
	st, _ := ctrl.Stats().Class("dep")
	require.GreaterOrEqual(t, st.ServiceP95, 290*time.Millisecond, "60 handlers cut at 221 ms say nothing of a p95 above that")

	busy, err := ctrl.AdmitAt(context.Background(), admission.Request{Method: hangM, Size: -1, Deadline: now.Add(time.Second)}, now)
	require.NoError(t, err)
	_, err = ctrl.AdmitAt(context.Background(), admission.Request{Method: hangM, Size: -1, Deadline: now.Add(220 * time.Millisecond)}, now)
	var se *status.Error
	require.True(t, errors.As(err, &se), "a 220 ms request while the class is busy: %v", err)
	require.Equal(t, status.ReasonDeadlineUnreachable, se.Reason())
	busy.AbandonAt(now)
}

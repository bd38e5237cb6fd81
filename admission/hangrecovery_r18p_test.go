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
	recoveryRefused           int // 220 ms requests arriving from 4 s, DEADLINE_UNREACHABLE
	lastRefusal               time.Duration
	stats                     admission.ClassStats
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
					out.recoveryRefused++
					out.lastRefusal = time.Duration(ms) * time.Millisecond
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
	t.Logf("hang 2.5–4 s: %d of the 220 ms requests refused, %d admitted; after recovery: %d refused DEADLINE_UNREACHABLE, the last at %v; false rejects %d; final mean %v p95 %v",
		r.hangRefused, r.hangAdmitted, r.recoveryRefused, r.lastRefusal, r.stats.FalseRejects, r.stats.ServiceMean, r.stats.ServiceP95)
	// The deadline-aware promise during the hang: a request that would be
	// cut is refused early (the slots are held by hung handlers; the
	// 220 ms requests are refused, not admitted to be cut).
	require.Greater(t, r.hangRefused, 10*r.hangAdmitted, "during the hang nearly every 220 ms request is refused early")
	// After it: the service takes 20 ms again. The refusals stop within
	// a few hundred ms (the handlers still hung at 4 s end by 4.7 s).
	require.Less(t, r.recoveryRefused, 60, "refused %d healthy 220 ms requests after recovery", r.recoveryRefused)
}

package admission

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// areviewDecide runs one arrival at now on the locked state, as admit does
// after its size check, and returns its outcome.
func areviewDecide(c *Controller, r Request, now time.Time) (*Permit, *waiter, status.Reason) {
	cs := c.classify(context.Background(), r)
	c.mu.Lock()
	c.virtual = true
	c.advance(now)
	p, w, reason, _, _ := c.decideLocked(r, cs, now)
	c.unlock()
	return p, w, reason
}

// Stats.PredictedWait is documented as the wait of a request arriving now
// (one its tenant's limits do not hold back): 0 exactly when such a request
// starts at once. Random runs over lending, tenant-limited, optional
// (degraded, recovering) classes, overrides, streams and deadlines check,
// after every step, that a probe of a fresh tenant arriving at the Stats
// call's instant starts at once exactly when its class's PredictedWait is
// 0 (refusals that a free slot does not decide — SHED — aside).
func TestAreviewR15PredictedWaitZeroIffAnArrivalStartsAtOnce(t *testing.T) {
	classes := []Class{
		{Name: "a", Slots: 2, QueueItems: 6, LendIdle: true, TenantRunning: 1, ExpectedServiceTime: 100 * time.Millisecond},
		{Name: "b", Slots: 2, QueueItems: 6, ExpectedServiceTime: 200 * time.Millisecond},
		{Name: "opt", Slots: 3, QueueItems: 6, Optional: true, LendIdle: true, ExpectedServiceTime: 50 * time.Millisecond},
	}
	names := []string{"a", "b", "opt"}
	tenants := []string{"t1", "t2", ""}
	seen := map[Mode]int{} // the effective modes the runs met
	zeros, waits := 0, 0   // probes predicted to start at once, to wait
	for seed := range 500 {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 15))
			var viol error
			c, err := New(WithClasses(classes...),
				WithClassifier(func(_ context.Context, r Request) string { return r.Method }),
				WithDegradation(Degradation{Window: time.Second, MinDecisions: 2, MaxRefusalRatio: 0.3, EnterAfter: 1, ExitAfter: 3, MaxQueueAge: 600 * time.Millisecond}),
				WithInvariantCheck(func(err error) {
					if err != nil && viol == nil {
						viol = err
					}
				}))
			require.NoError(t, err)
			defer func() { _ = c.Close() }()
			now := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
			var permits []*Permit
			for step := range 120 {
				switch k := rng.IntN(10); {
				case k < 4:
					r := Request{Method: names[rng.IntN(3)], Tenant: tenants[rng.IntN(3)], Stream: rng.IntN(6) == 0}
					if rng.IntN(2) == 0 {
						r.Deadline = now.Add(time.Duration(rng.IntN(1200)) * time.Millisecond)
					}
					if p, _, _ := areviewDecide(c, r, now); p != nil {
						permits = append(permits, p)
					}
				case k < 7 && len(permits) > 0:
					i := rng.IntN(len(permits))
					if rng.IntN(3) == 0 {
						permits[i].AbandonAt(now)
					} else {
						permits[i].ReleaseAt(now)
					}
					permits = append(permits[:i], permits[i+1:]...)
				case k < 9:
					next := now.Add(time.Duration(rng.IntN(2500)) * time.Millisecond)
					c.mu.Lock()
					peeked := c.peekMode(next)
					c.mu.Unlock()
					require.Equal(t, peeked, c.ModeAt(next), "step %d: the metrics' peek disagrees with the mode", step)
					now = next
				default:
					o := Override{Actor: "areview", Reason: "r15", TTL: time.Duration(1+rng.IntN(3000)) * time.Millisecond}
					switch rng.IntN(4) {
					case 0:
						o.Class, o.Slots = names[rng.IntN(3)], 1
					case 1:
						o.Class, o.Freeze = names[rng.IntN(3)], true
					case 2:
						o.Mode = Mode(1 + rng.IntN(3))
					default:
						o.Class, o.QueueItems = names[rng.IntN(3)], 1+rng.IntN(3)
					}
					_, err := c.SetOverrideAt(context.Background(), o, now)
					require.NoError(t, err)
				}
				st := c.StatsAt(now)
				seen[st.Mode]++
				require.Equal(t, st, c.StatsAt(now), "step %d: a second snapshot at the same instant changed something", step)
				i := rng.IntN(3)
				cl := st.Classes[i]
				c.mu.Lock()
				cs := c.byName[cl.Name]
				skip := cs.frozen || c.shedding(cs)
				c.mu.Unlock()
				if skip {
					continue
				}
				p, w, reason := areviewDecide(c, Request{Method: cl.Name, Tenant: fmt.Sprint("fresh", step)}, now)
				if cl.PredictedWait == 0 {
					zeros++
					require.NotNil(t, p, "step %d: %s predicts no wait, yet a fresh arrival was not started (queued %v, refused %v)", step, cl.Name, w != nil, reason)
				} else {
					waits++
					require.Nil(t, p, "step %d: %s predicts %v, yet a fresh arrival started at once", step, cl.Name, cl.PredictedWait)
				}
				if w != nil {
					// Queued: it was told the wait Stats predicted.
					require.Equal(t, cl.PredictedWait, w.predicted, "step %d: %s: Stats predicted %v, the arrival was told %v", step, cl.Name, cl.PredictedWait, w.predicted)
				}
				if p != nil {
					p.AbandonAt(now)
				}
				require.NoError(t, viol)
			}
		})
	}
	t.Logf("modes met: %v; probes predicted to start at once %d, to wait %d", seen, zeros, waits)
	require.Positive(t, seen[ModeDegraded])
	require.Positive(t, seen[ModeRecovering])
	require.Positive(t, zeros)
	require.Positive(t, waits)
}

// Stats now drops and starts waiters. Hammered on the real clock while
// requests arrive, wait, give up by their timers, are cancelled and end,
// every Admit is still decided exactly once (one decision counted in
// tollgate.admission.decisions per call), each DEADLINE_EXPIRED refusal is
// one deadline miss (admission or dequeue stage), the invariants hold at
// every change, and the controller ends empty.
func TestAreviewR15StatsHammeredCountsEachRequestOnce(t *testing.T) {
	c, reader, violation := hammeredController(t, Degradation{Window: 20 * time.Millisecond, MinDecisions: 2, MaxRefusalRatio: 0.3, MaxQueueAge: 10 * time.Millisecond},
		Class{Name: "a", Slots: 2, QueueItems: 8, LendIdle: true, TenantRunning: 1, ExpectedServiceTime: 5 * time.Millisecond},
		Class{Name: "b", Slots: 1, QueueItems: 8, ExpectedServiceTime: 8 * time.Millisecond})
	stop := make(chan struct{})
	var hammer sync.WaitGroup
	hammer.Add(1)
	go func() {
		defer hammer.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = c.Stats()
			if id, err := c.SetOverride(context.Background(), Override{Actor: "areview", Reason: "r15", TTL: 3 * time.Millisecond, Class: "b", Freeze: true}); err == nil && id%3 == 0 {
				c.ClearOverride(context.Background(), id)
			}
			_ = c.RetryAfter("a")
			_ = c.Mode()
			_ = c.Overrides()
			var rm metricdata.ResourceMetrics
			_ = reader.Collect(context.Background(), &rm)
		}
	}()
	const n = 600
	var wg sync.WaitGroup
	var expired atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(2+rng.IntN(40))*time.Millisecond)
			defer cancel()
			if rng.IntN(5) == 0 {
				after := time.Duration(rng.IntN(10)) * time.Millisecond
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(after)
					cancel()
				}()
			}
			r := Request{Method: []string{"a", "b"}[rng.IntN(2)], Tenant: []string{"t1", "t2", ""}[rng.IntN(3)]}
			if rng.IntN(4) != 0 {
				r.Deadline = time.Now().Add(time.Duration(1+rng.IntN(40)) * time.Millisecond)
			}
			p, err := c.Admit(ctx, r)
			if err != nil {
				var se *status.Error
				if errors.As(err, &se) && se.Reason() == status.ReasonDeadlineExpired {
					expired.Add(1)
				}
				return
			}
			time.Sleep(time.Duration(rng.IntN(6)) * time.Millisecond)
			switch rng.IntN(3) {
			case 0:
				p.Release()
			case 1:
				p.ReleaseMissCounted()
			default:
				p.Abandon()
			}
		}()
		if i%50 == 49 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	wg.Wait()
	close(stop)
	hammer.Wait()

	decisions, _, misses := hammerCounts(t, reader)
	require.Equal(t, int64(n), decisions, "one decision per Admit")
	require.Equal(t, expired.Load(), misses, "one miss per DEADLINE_EXPIRED refusal")
	total, _ := requireDrained(t, c.Stats())
	require.EqualValues(t, n, total, "one decision per Admit in the stats")
	require.NoError(t, c.Close())
	require.NoError(t, violation())
}

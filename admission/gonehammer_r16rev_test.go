package admission

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Hammered on the real clock while waiters' callers go away just as
// releases, overrides (trims, freezes, a forced Degraded mode), Stats and
// finally Close find them, every Admit is decided exactly once: one
// decision in tollgate.admission.decisions and one in the classes' stats
// per call, a cancelled one only for a caller whose context ended, one
// deadline miss per DEADLINE_EXPIRED; every permit is released, the
// invariants hold at every change, and the controller ends empty.
func TestR16revGoneWaitersHammeredAreDecidedOnce(t *testing.T) {
	c, reader, violation := r16revHammered(t)
	stop := make(chan struct{})
	var hammer sync.WaitGroup
	hammer.Add(1)
	go func() {
		defer hammer.Done()
		rng := rand.New(rand.NewPCG(1, 16))
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = c.Stats()
			o := r16revOverride(rng)
			if id, err := c.SetOverride(context.Background(), o); err == nil && rng.IntN(2) == 0 {
				c.ClearOverride(context.Background(), id)
			}
			time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
		}
	}()
	const n = 800
	var wg sync.WaitGroup
	var expired, cancelledSeen atomic.Int64
	closeAt := n * 3 / 4 // Close finds waiters, some of them gone
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 16))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if rng.IntN(3) == 0 {
				var cause context.CancelCauseFunc
				ctx, cause = context.WithCancelCause(ctx)
				endLater(&wg, time.Duration(rng.IntN(3000))*time.Microsecond, rng.IntN(4) == 0, cause)
			}
			r := Request{Method: []string{"a", "b"}[rng.IntN(2)], Tenant: []string{"t1", "t2", ""}[rng.IntN(3)]}
			if rng.IntN(3) != 0 {
				r.Deadline = time.Now().Add(time.Duration(2+rng.IntN(30)) * time.Millisecond)
			}
			p, err := c.Admit(ctx, r)
			if err != nil {
				require.Nil(t, p)
				o := status.OutcomeOf(err)
				switch o.Reason {
				case status.ReasonDeadlineExpired:
					expired.Add(1)
				case status.ReasonUnspecified:
					cancelledSeen.Add(1)
					require.True(t, errors.Is(err, context.Canceled), "cancelled only for a caller that went away: %v", err)
				}
				return
			}
			time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond)
			if rng.IntN(2) == 0 {
				p.Release()
			} else {
				p.Abandon()
			}
		}()
		if i == closeAt {
			require.NoError(t, c.Close())
		}
		if i%40 == 39 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	wg.Wait()
	close(stop)
	hammer.Wait()

	decisions, cancelled, misses := hammerCounts(t, reader)
	// (the metric callbacks are unregistered by Close: counters still count)
	total, statsCancelled := requireDrained(t, c.Stats())
	require.EqualValues(t, n, total, "one decision per Admit in the stats")
	require.EqualValues(t, n, decisions, "one decision per Admit in the metric")
	require.EqualValues(t, cancelledSeen.Load(), statsCancelled)
	require.EqualValues(t, cancelledSeen.Load(), cancelled)
	require.Equal(t, expired.Load(), misses, "one miss per DEADLINE_EXPIRED refusal")
	require.NoError(t, violation())
}

// The same on a virtual clock (AdmitAt, ReleaseAt, AbandonAt, StatsAt,
// SetOverrideAt), its time moved on by every call: every AdmitAt is decided
// exactly once, in the stats and the metric, and the controller ends
// empty once a last StatsAt has started what can start.
func TestR16revGoneWaitersVirtualAreDecidedOnce(t *testing.T) {
	c, reader, violation := r16revHammered(t)
	var clk atomic.Int64 // virtual nanoseconds since epoch0
	epoch0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { return epoch0.Add(time.Duration(clk.Add(int64(50 * time.Microsecond)))) }
	var tmu sync.Mutex // one caller at a time gives the controller its time, in order
	at := func(f func(time.Time)) {
		tmu.Lock()
		defer tmu.Unlock()
		f(now())
	}
	stop := make(chan struct{})
	var hammer sync.WaitGroup
	hammer.Add(1)
	go func() {
		defer hammer.Done()
		rng := rand.New(rand.NewPCG(2, 16))
		for {
			select {
			case <-stop:
				return
			default:
			}
			at(func(n time.Time) { _ = c.StatsAt(n) })
			o := r16revOverride(rng)
			at(func(n time.Time) { _, _ = c.SetOverrideAt(context.Background(), o, n) })
			time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
		}
	}()
	const n = 600
	var wg sync.WaitGroup
	var cancelledSeen atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 17))
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			after := time.Duration(rng.IntN(2000)) * time.Microsecond
			byDeadline := rng.IntN(4) == 0
			if rng.IntN(3) == 0 {
				endLater(&wg, after, byDeadline, cancel)
			}
			r := Request{Method: []string{"a", "b"}[rng.IntN(2)], Tenant: []string{"t1", "t2", ""}[rng.IntN(3)]}
			var p *Permit
			var err error
			tmu.Lock()
			t0 := now()
			if rng.IntN(3) != 0 {
				r.Deadline = t0.Add(time.Duration(2+rng.IntN(30)) * time.Millisecond)
			}
			tmu.Unlock()
			// (AdmitAt waits outside tmu: a waiter must not hold the clock.)
			p, err = c.AdmitAt(ctx, r, t0)
			if err != nil {
				if status.OutcomeOf(err).Reason == status.ReasonUnspecified {
					cancelledSeen.Add(1)
					require.True(t, errors.Is(err, context.Canceled), "%v", err)
				}
				return
			}
			time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
			if rng.IntN(2) == 0 {
				at(p.ReleaseAt)
			} else {
				at(p.AbandonAt)
			}
		}()
		if i%40 == 39 {
			time.Sleep(time.Millisecond)
		}
	}
	// Waiters that nothing else will start or drop: later times let the
	// queues drain (deadlines pass, waiters start as permits end).
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for drained := false; !drained; {
		select {
		case <-done:
			drained = true
		default:
			at(func(n time.Time) { _ = c.StatsAt(n.Add(time.Second)) })
			clk.Add(int64(time.Second))
			time.Sleep(time.Millisecond)
		}
	}
	close(stop)
	hammer.Wait()

	decisions, _, _ := hammerCounts(t, reader)
	var st Stats
	at(func(n time.Time) { st = c.StatsAt(n) })
	total, statsCancelled := requireDrained(t, st)
	require.EqualValues(t, n, total, "one decision per AdmitAt in the stats")
	require.EqualValues(t, n, decisions, "one decision per AdmitAt in the metric")
	require.EqualValues(t, cancelledSeen.Load(), statsCancelled)
	require.NoError(t, c.Close())
	require.NoError(t, violation())
}

// r16revHammered is the controller both hammer tests drive: a lending
// class with a tenant limit and an optional class, with degradation, its
// decisions counted by reader. violation returns the first invariant
// violation the controller reported, or nil.
func r16revHammered(t *testing.T) (c *Controller, reader *sdkmetric.ManualReader, violation func() error) {
	t.Helper()
	return hammeredController(t, Degradation{Window: 15 * time.Millisecond, MinDecisions: 2, MaxRefusalRatio: 0.3, MaxQueueAge: 8 * time.Millisecond},
		Class{Name: "a", Slots: 2, QueueItems: 6, LendIdle: true, TenantRunning: 1, ExpectedServiceTime: 3 * time.Millisecond},
		Class{Name: "b", Slots: 1, QueueItems: 6, Optional: true, ExpectedServiceTime: 4 * time.Millisecond})
}

// r16revOverride is one of the hammer's overrides: a trim of a class's
// queue, a freeze of b or a forced Degraded mode, lasting a few ms.
func r16revOverride(rng *rand.Rand) Override {
	o := Override{Actor: "r16rev", Reason: "hammer", TTL: time.Duration(1+rng.IntN(4)) * time.Millisecond}
	switch rng.IntN(3) {
	case 0:
		o.Class, o.QueueItems = []string{"a", "b"}[rng.IntN(2)], 1+rng.IntN(2)
	case 1:
		o.Class, o.Freeze = "b", true
	default:
		o.Mode = ModeDegraded
	}
	return o
}

// endLater ends a context by cancel after d — by a deadline (its cause
// context.DeadlineExceeded) when byDeadline, else as its caller's going
// away — on a goroutine wg waits for.
func endLater(wg *sync.WaitGroup, d time.Duration, byDeadline bool, cancel context.CancelCauseFunc) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(d)
		if byDeadline {
			cancel(context.DeadlineExceeded)
		} else {
			cancel(nil)
		}
	}()
}

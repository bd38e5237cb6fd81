package admission_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Review 13 asked whether the wake timer (which starts the waiters an
// expiring override lets start) and a waiter's context ending at the same
// instant can start a waiter and refuse it too, leak a slot, or lose a
// permit. The wake timer runs on the real clock only (WithClock arms none),
// so the instant is approximated: the override's TTL and the waiter's
// context are armed together, many times over, under the race detector.
// Every wait must end exactly one way — a permit (the decision stood as the
// context ended: the caller's to release) or a refusal — and every slot
// must come back: the controller's own invariant check (WithInvariantCheck)
// sees no start over the limits, and no request runs or waits at the end.
func TestWakeTimerAndContextEndAtOneInstant(t *testing.T) {
	var mu sync.Mutex
	var viol []error
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "work", Slots: 2, QueueItems: 1, ExpectedServiceTime: time.Millisecond}),
		admission.WithInvariantCheck(func(err error) {
			if err != nil {
				mu.Lock()
				viol = append(viol, err)
				mu.Unlock()
			}
		}))
	require.NoError(t, err)
	defer func() { require.NoError(t, ctrl.Close()) }()
	held, err := ctrl.Admit(context.Background(), admission.Request{Method: "/demo.W/Do", Size: -1})
	require.NoError(t, err)

	const rounds = 60
	started, refused := 0, 0
	for range rounds {
		_, err := ctrl.SetOverride(context.Background(), admission.Override{
			Actor: "test", Reason: "review13", TTL: 3 * time.Millisecond, Class: "work", Slots: 1})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(3*time.Millisecond, cancel) // the override's expiry, as near as two timers get
		p, err := ctrl.Admit(ctx, admission.Request{Method: "/demo.W/Do", Size: -1})
		stop.Stop()
		cancel()
		switch {
		case err == nil:
			require.NotNil(t, p)
			started++
			p.Release()
			p.Release() // a second end does nothing
		default:
			require.Nil(t, p, "a permit with a refusal: %v", err)
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.True(t, errors.Is(err, context.Canceled), "%v", err)
			refused++
		}
		// The override has expired or is cleared now either way.
		for _, a := range ctrl.Overrides() {
			ctrl.ClearOverride(context.Background(), a.ID)
		}
		s, _ := ctrl.Stats().Class("work")
		require.Equal(t, 1, s.Running, "only the held permit runs")
		require.Equal(t, 0, s.Queued, "no waiter is left in the queue")
	}
	t.Logf("started %d, refused %d of %d", started, refused, rounds)
	held.Release()
	s, _ := ctrl.Stats().Class("work")
	require.Equal(t, 0, s.Running)
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, viol)
}

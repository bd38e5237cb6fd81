package admission_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// Close pumps after draining, so that a control waiter may start on a
// lender's idle slot; the pump must start nothing of the lender's own class,
// whose waiters Close refused and whose later Admit calls, racing with
// Close or coming after it, are refused DRAINING, never started on a slot
// the pump left idle.
func TestR16cCloseRacingAdmitsStartNoDataRequestAfterIt(t *testing.T) {
	for i := 0; i < 50; i++ {
		ctrl, err := admission.New(admission.WithClasses(
			admission.Class{Name: "lender", Slots: 2, QueueItems: 4, LendIdle: true, TenantRunning: 1},
			admission.Class{Name: admission.ControlClass, Slots: 1, QueueItems: 4},
		), admission.WithMethods("lender", heavyM))
		require.NoError(t, err)
		held, err := ctrl.Admit(t.Context(), admission.Request{Method: heavyM, Tenant: "x", Size: -1})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		var mu sync.Mutex
		var permits []*admission.Permit
		closed := make(chan struct{})
		for g := 0; g < 6; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m, actx := heavyM, t.Context() // a data request never waits past Close
				if g%3 == 0 {
					m, actx = attemptM, ctx // a control waiter's caller goes at the end
				}
				after := false
				select {
				case <-closed:
					after = true
				default:
				}
				p, err := ctrl.Admit(actx, admission.Request{Method: m, Tenant: "x", Size: -1})
				if err == nil {
					if after && m == heavyM {
						t.Errorf("a data request admitted after Close returned")
					}
					mu.Lock()
					permits = append(permits, p)
					mu.Unlock()
					return
				}
				if after && m == heavyM {
					if o := status.OutcomeOf(err); o.Reason != status.ReasonDraining {
						t.Errorf("a data request after Close refused %v, not DRAINING", err)
					}
				}
			}()
		}
		require.NoError(t, ctrl.Close())
		close(closed)
		// Control waiters may wait for a running permit: their callers go.
		held.Release()
		cancel()
		wg.Wait()
		mu.Lock()
		for _, p := range permits {
			p.Release()
		}
		mu.Unlock()
	}
}

package idempotency_test

import (
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// A review found that storetest.Run, since it moves its clock ClockLead
// ahead of real time just before the horizons start, moved it past a memory
// store's horizon, which starts when the store is built: by every
// millisecond the harness took. The suite takes the horizon to lie at the
// clock's time after the move (e.start), so a correct store failed
// HorizonSkew and MintedSkipsOnlyHorizonPlusSkew whenever building it
// crossed a millisecond (a loaded machine, -race). Here the harness takes
// a few milliseconds, as such a machine can.
func TestMemoryConformanceAfterSlowBuild(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock, p idempotency.Policy) storetest.Harness {
		s := newMemory(t, clock, p)
		time.Sleep(5 * time.Millisecond)
		return storetest.Harness{Store: s, Lose: func(*testing.T) { s.Reset() }}
	})
}

package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// Clients of an optional class shed all through a Degraded window are all
// told the same instant, the window's end T, jittered over [1, 1½) of the
// time left: a client shed u before T comes back within u/2 after it, so
// the ones shed late in the window come back together at T — about 17% of
// the window's shed clients in the first 2% of the next window, eight
// times their share — where the class, re-admitted by Recovering's first
// step with part of its capacity, may refuse them (refusals that count
// against the window, and can take the mode back to Degraded). Their
// returns spread over at least half a window after T, as the pre-r18
// suggestion (a window, jittered over [½, 1½)) spread them over a window.
func TestR18qShedClientsDoNotComeBackTogether(t *testing.T) {
	h := degradeHarness(t, 1, 3)
	require.Equal(t, admission.ModeDegraded, h.window(true)) // at 1 s; the window ends at T = 2 s
	const n = 1000
	step := time.Second / n
	var soon, soonTap int // returns in [T, T+20ms)
	for i := range n {
		left := time.Second - time.Duration(i)*step // T less now
		ra := h.shedRA(work(optM))
		require.GreaterOrEqual(t, ra, left, "not before T")
		if ra < left+20*time.Millisecond {
			soon++
		}
		if ra := tapShedRA(t, h.ctrl, optM); ra < left+20*time.Millisecond {
			soonTap++
		}
		h.clk.Advance(step)
	}
	t.Logf("of %d clients shed over the window, %d (Admit) and %d (tap) come back in the first 20 ms after it", n, soon, soonTap)
	// Spread evenly over half a window, 4% would.
	require.Less(t, soon, n*8/100, "Admit's SHED retry-afters bunch at the window's end")
	require.Less(t, soonTap, n*8/100, "the tap's SHED retry-afters bunch at the window's end")
}

package admission_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

// Class main is saturated for 5 windows (its one slot held, its queue
// full) and every arrival, 50 per window, is refused QUEUE_FULL. With
// EnterAfter 2 that is 5 consecutive overloaded windows: Degraded. When
// Admit refuses them, each refusal closes the elapsed windows first, and
// the controller degrades. When the tap refuses them (the interceptor's
// default), nothing closes a window while the mode is Normal (the tap's due
// time is set only when not Normal), and foldTapRefusals puts every tap
// refusal made since the last roll into the first window it closes: all
// 250 land in window 1, windows 2–5 read empty and healthy, and the mode
// stays NORMAL through 5 windows of total overload. Same load, two
// verdicts, depending only on which layer refused.
func TestRegression13TapRefusalsKeepTheirWindow(t *testing.T) {
	for _, viaTap := range []bool{false, true} {
		t.Run(fmt.Sprintf("viaTap=%v", viaTap), func(t *testing.T) {
			h := newHarness(t,
				admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 1}),
				admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 20, EnterAfter: 2, ExitAfter: 3}))
			p := h.admitted(work("/demo.Main/Do"))
			defer p.Abandon()
			h.queued(work("/demo.Main/Do"))
			info := &tap.Info{FullMethodName: "/demo.Main/Do"}
			for range 5 {
				for range 50 {
					if viaTap {
						_, err := h.ctrl.TapHandle(context.Background(), info)
						if status.OutcomeOf(err).Reason != status.ReasonQueueFull {
							t.Fatalf("tap: %v, want QUEUE_FULL", err)
						}
					} else {
						h.refused(work("/demo.Main/Do"), status.ReasonQueueFull)
					}
				}
				h.clk.Advance(time.Second)
			}
			m := h.ctrl.Mode()
			h.drain()
			if m != admission.ModeDegraded {
				t.Errorf("5 consecutive windows with every arrival refused QUEUE_FULL (EnterAfter 2), mode %v (refused by the tap: %v)", m, viaTap)
			}
		})
	}
}

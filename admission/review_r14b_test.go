package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix). DESIGN.md
// §3.6: refusals are allocation-light. The play-out (playOutLocked) counted
// the slots no request holds as free now by prepending that many zeros to
// its ends in a fresh slice: a refusal made with a slot free — the deadline
// stage's DEADLINE_UNREACHABLE for a request that cannot finish even
// without waiting, whose retry-after asks the predicted wait — allocated
// that slice whenever a stream held one of the class's slots, and the same
// refusal beside a unary call did not.
func TestPlayOutFreeSlotsRefusalAllocatesNoMoreThanUnary(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	allocs := func(stream bool) float64 {
		ctrl, err := admission.New(admission.WithClock(func() time.Time { return t0 }),
			admission.WithClasses(admission.Class{Name: "work", Slots: 8, QueueItems: 4, ExpectedServiceTime: 10 * time.Millisecond}),
			admission.WithDefaultClass("work"))
		require.NoError(t, err)
		defer func() { _ = ctrl.Close() }()
		ctx := context.Background()
		p, err := ctrl.AdmitAt(ctx, admission.Request{Method: "/s.S/Watch", Size: -1, Stream: stream}, t0)
		require.NoError(t, err)
		defer p.Abandon()
		// 5 ms left for 10 ms of work: refused with seven slots free.
		r := admission.Request{Method: "/s.S/Get", Size: 1, Deadline: t0.Add(5 * time.Millisecond)}
		return testing.AllocsPerRun(200, func() {
			_, err := ctrl.AdmitAt(ctx, r, t0)
			if status.OutcomeOf(err).Reason != status.ReasonDeadlineUnreachable {
				t.Fatalf("want DEADLINE_UNREACHABLE, got %v", err)
			}
		})
	}
	unary, stream := allocs(false), allocs(true)
	t.Logf("allocations per refusal with slots free: beside a unary call %v, beside a stream %v", unary, stream)
	require.LessOrEqual(t, stream, unary, "a refusal with slots free beside a stream allocates the play-out's padded slice")
}

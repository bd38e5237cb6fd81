package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// A review found that a class whose slots are lowered (an override, or
// Recovering's step) predicted no wait while its only running request was
// a stream on a slot it had borrowed: a lowered class starts nothing while
// as many of its requests run as its lowered slots, wherever they run, but
// the prediction left a borrowed stream out as "holding none of this
// class's slots". A request that cannot start before the stream ends was
// queued with a predicted wait of 0 (to be dropped later), rather than
// refused DEADLINE_UNREACHABLE with a delay that reflects the stream.
func TestLoweredClassWaitsForItsStreamOnABorrowedSlot(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(
			admission.Class{Name: "opt", Slots: 2, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond},
			admission.Class{Name: "lender", Slots: 1, LendIdle: true, ExpectedServiceTime: 100 * time.Millisecond}),
		admission.WithMethods("lender", "/demo.Lender/"))
	stream := admission.Request{Method: mainM, Size: -1, Stream: true}
	s1, s2 := h.admitted(stream), h.admitted(stream)
	s3 := h.admitted(stream) // on the lender's idle slot
	s1.Abandon()
	s2.Abandon()
	h.drain()
	h.override(admission.Override{Actor: "test", Reason: "one slot", Class: "opt", Slots: 1, TTL: time.Hour})

	st, ok := h.ctrl.Stats().Class("opt")
	require.True(t, ok)
	require.Equal(t, 1, st.Running, "the stream on the borrowed slot")
	require.GreaterOrEqual(t, st.PredictedWait, 100*time.Millisecond,
		"nothing of opt starts before its stream ends, which has lived 0 and is expected to live at least the mean")
	s3.Abandon()
	h.drain()
}

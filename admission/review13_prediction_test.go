package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// Review 13 checked the wait prediction of a class that mixes unary calls
// and streams. These tests pin what a request refused DEADLINE_UNREACHABLE
// would have met: a request with no deadline, queued at the same instant,
// shows when the class would have started it.

// A class lowered by an override below the requests it runs (one stream,
// two unary calls; slots lowered from 4 to 2) starts its next request as
// soon as fewer than 2 run: when both unary calls end, at 1s. The
// prediction left the stream's slot out and spread the two unary calls'
// remaining work over the one slot left, 2s, and refused a request due in
// 2.5s that would have started at 1s and finished at 2s.
func TestLoweredClassWithAStreamPredictsItsStartWhenEnoughEnd(t *testing.T) {
	h := newHarness(t, mainOf1s(4))
	stream := h.admitted(streamOn(mainM))
	u1 := h.admitted(work(mainM))
	u2 := h.admitted(work(mainM))
	h.override(admission.Override{Actor: "test", Reason: "review13", TTL: time.Hour, Class: "main", Slots: 2})

	r := work(mainM)
	r.Deadline = h.clk.Now().Add(2500 * time.Millisecond)
	id, e := h.arrive(r)
	probe := h.queued(work(mainM)) // no deadline: shows when a start comes

	h.clk.Advance(time.Second)
	h.release(u1)
	h.release(u2)
	first := id // the first queued: r, or the probe if r was refused
	if e.Kind != admission.EventQueued {
		first = probe
	}
	res := h.take(first)
	require.NoError(t, res.err, "nothing started at 1s")
	require.Equal(t, admission.EventQueued, e.Kind,
		"refused %v though a request queued with it started at 1s, in time to finish by 2s of 2.5s", e.Reason)
	res.permit.Abandon() // the probe starts on its slot
	h.drain()
	h.take(probe).permit.Abandon()
	stream.Abandon()
	h.drain()
}

// A stream whose deadline is near (100ms away) ends there (its handler's
// context ends):
// with a slot free of streams (so no play-out), the prediction kept the
// stream's slot out of the count for good, and a request due in 1.5s, which
// starts on the stream's slot at 100ms and finishes at 1.1s, was refused
// behind the unary call's 1s.
func TestStreamEndingAtItsDeadlineFreesItsSlotInThePrediction(t *testing.T) {
	h := newHarness(t, mainOf1s(2))
	s := streamOn(mainM)
	s.Deadline = h.clk.Now().Add(2 * time.Second)
	stream := h.admitted(s)
	h.clk.Advance(1900 * time.Millisecond) // 100ms left to the stream
	u := h.admitted(work(mainM))

	r := work(mainM)
	r.Deadline = h.clk.Now().Add(1500 * time.Millisecond)
	id, e := h.arrive(r)

	h.clk.Advance(100 * time.Millisecond)
	h.drain()
	stream.Abandon() // its handler's context ended at its deadline
	h.drain()
	require.Equal(t, admission.EventQueued, e.Kind,
		"refused %v though the stream's slot freed at 100ms, in time to finish by 1.1s of 1.5s", e.Reason)
	res := h.take(id)
	require.NoError(t, res.err)
	res.permit.Abandon()
	u.Abandon()
	h.drain()
}

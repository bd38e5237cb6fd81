package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// With nothing learned, a running request is expected to run as long again
// as it has run — but not past its deadline, where its handler's context
// ends (as a stream's guessed end is not: Permit.remaining). One that has
// run 2 s with 100 ms left frees its slot within 100 ms, not in 2 s.
func TestR18qUnknownWaitEndsARunningRequestByItsDeadline(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "a", Slots: 1}),
		admission.WithDefaultClass("a"))
	r := work(unknownM)
	r.Deadline = h.clk.Now().Add(2100 * time.Millisecond)
	p := h.admitted(r)
	h.tick(2 * time.Second) // run 2 s, 100 ms left

	st, _ := h.ctrl.Stats().Class("a")
	require.LessOrEqual(t, st.PredictedWait, 100*time.Millisecond, "it ends by its deadline")
	for range 20 {
		err := h.refused(work(unknownM), status.ReasonConcurrencyFull)
		ra, ok := status.RetryAfter(err)
		require.True(t, ok)
		require.Less(t, ra, 150*time.Millisecond, "jittered from at most 100 ms")
	}
	h.release(p)
}

// A stream holds its slot for its lifetime: its age is no work that the
// class's other slots share. A class whose stream has lived an hour and
// whose other slot runs a request that has run 1 s expects that slot free
// in about a second, not the hour spread over its two slots (30 min, and
// retry-afters at the bound).
func TestR18qUnknownWaitDoesNotSpreadAStreamsAgeOverTheSlots(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "a", Slots: 2}),
		admission.WithDefaultClass("a"))
	s := h.admitted(admission.Request{Method: unknownM, Size: -1, Stream: true})
	h.tick(time.Hour)
	p := h.admitted(work(unknownM))
	h.tick(time.Second)

	st, _ := h.ctrl.Stats().Class("a")
	require.Equal(t, 2, st.UsedSlots)
	require.LessOrEqual(t, st.PredictedWait, time.Second, "the unary request is expected to run as long again")
	for range 20 {
		err := h.refused(work(unknownM), status.ReasonConcurrencyFull)
		ra, ok := status.RetryAfter(err)
		require.True(t, ok)
		require.Less(t, ra, 1500*time.Millisecond, "jittered from a 1 s wait")
	}
	h.release(p)
	s.EndStream()
}

// TENANT_LIMIT's retry-after, with nothing learned, expects the tenant's
// running request to run as long again too: but not past its deadline.
func TestR18qUnknownTenantRetryAfterEndsARunningRequestByItsDeadline(t *testing.T) {
	h := newHarness(t,
		admission.WithClasses(admission.Class{Name: "a", Slots: 4, TenantRunning: 1}),
		admission.WithDefaultClass("a"))
	r := work(unknownM)
	r.Tenant = "t1"
	r.Deadline = h.clk.Now().Add(2100 * time.Millisecond)
	p := h.admitted(r)
	h.tick(2 * time.Second) // run 2 s, 100 ms left
	for range 20 {
		err := h.refused(work2(r), status.ReasonTenantLimit)
		ra, ok := status.RetryAfter(err)
		require.True(t, ok)
		require.Less(t, ra, 150*time.Millisecond, "jittered from at most 100 ms")
	}
	h.release(p)
}

// work2 is r without its deadline (another request of the same tenant).
func work2(r admission.Request) admission.Request {
	r.Deadline = time.Time{}
	return r
}

package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// TestAdmitDecisionQueuedAhead: with one slot and three places, the first
// request is admitted behind no one; the next three wait behind 0, 1 and 2
// requests and, once started, their permits say so; a fifth is refused
// QUEUE_FULL and reports the 3 it found waiting.
func TestAdmitDecisionQueuedAhead(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 3}), admission.WithDefaultClass("work"))
	r := work("/demo.Jobs/Run")

	first := h.admitted(r)
	require.Zero(t, first.QueuedAhead(), "a request admitted at once waited behind no one")

	ids := []int{h.queued(r), h.queued(r), h.queued(r)}

	id, e := h.arrive(r)
	require.Equal(t, admission.EventRefused, e.Kind)
	res := h.take(id)
	require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(res.err).Reason)
	require.Nil(t, res.permit)
	require.Equal(t, admission.Decision{Class: "work", QueuedAhead: 3}, res.decision, "a refusal reports the queue it saw")

	prev := first
	for n, id := range ids {
		h.release(prev)
		res := h.take(id)
		require.NoError(t, res.err)
		require.Equal(t, admission.Decision{Class: "work", QueuedAhead: n}, res.decision)
		require.Equal(t, n, res.permit.QueuedAhead(), "request %d joined the queue behind %d", id, n)
		prev = res.permit
	}
	h.release(prev)

	again := h.admitted(r)
	require.Zero(t, again.QueuedAhead(), "the queue is empty again")
	h.release(again)
}

// TestAdmitDecisionLeftUnrunKeepsTheQueueItSaw: a request that waited behind
// one and left the queue unrun (its context ended) reports the one it
// waited behind, with its refusal.
func TestAdmitDecisionLeftUnrunKeepsTheQueueItSaw(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4}), admission.WithDefaultClass("work"))
	r := work("/demo.Jobs/Run")
	p := h.admitted(r)
	h.queued(r)
	second := h.queued(r)

	res := h.cancel(second)
	require.ErrorIs(t, res.err, context.Canceled)
	require.Nil(t, res.permit)
	require.Equal(t, admission.Decision{Class: "work", QueuedAhead: 1}, res.decision)
	h.release(p)
}

// TestAdmitDecisionTooLargeReportsTheQueue: the size stage refuses without
// looking at the queue, but under the same lock it still reports the
// requests it found waiting, like every refusal on arrival.
func TestAdmitDecisionTooLargeReportsTheQueue(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4, MaxRequestBytes: 64}), admission.WithDefaultClass("work"))
	r := admission.Request{Method: "/demo.Jobs/Run", Size: 8}
	p := h.admitted(r)
	h.queued(r)
	h.queued(r)

	h.refused(admission.Request{Method: "/demo.Jobs/Run", Size: 65}, status.ReasonRequestTooLarge)
	last := h.log[len(h.log)-1]
	require.Equal(t, admission.EventRefused, last.Kind)
	require.Equal(t, 2, last.QueuedAhead, "the event and the decision agree (the harness checks the decision)")
	h.release(p)
}

// TestAdmitDecisionAdmittedPastHeldBackWaitersReportsZero: a request that
// gets a free slot on arrival waited behind no one, even while another
// tenant's request waits for its own tenant's running limit.
func TestAdmitDecisionAdmittedPastHeldBackWaitersReportsZero(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "work", Slots: 2, QueueItems: 4, TenantRunning: 1}), admission.WithDefaultClass("work"))
	a := admission.Request{Method: "/demo.Jobs/Run", Size: -1, Tenant: "a"}
	b := admission.Request{Method: "/demo.Jobs/Run", Size: -1, Tenant: "b"}
	pa := h.admitted(a)
	heldBack := h.queued(a)
	st, _ := h.ctrl.Stats().Class("work")
	require.Equal(t, 1, st.Queued)

	pb := h.admitted(b)
	require.Zero(t, pb.QueuedAhead())

	h.release(pa)
	res := h.take(heldBack)
	require.NoError(t, res.err)
	require.Zero(t, res.permit.QueuedAhead(), "it joined an empty queue")
	h.release(res.permit)
	h.release(pb)
}

// TestAdmitDecisionContextEndedBeforeLooking: a request whose context had
// ended is refused before any stage looks at it, but after it is
// classified (it is counted in its class: see
// TestContextEndedBeforeLookingIsCounted): the decision names the class and
// the requests queued in it.
func TestAdmitDecisionContextEndedBeforeLooking(t *testing.T) {
	ctrl, err := admission.New()
	require.NoError(t, err)
	defer ctrl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p, d, err := ctrl.AdmitDecision(ctx, work("/demo.Jobs/Run"))
	require.Nil(t, p)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, admission.Decision{Class: admission.DefaultClass}, d)
}

func TestPermitQueuedAheadNil(t *testing.T) {
	var p *admission.Permit
	require.Zero(t, p.QueuedAhead())
}

// TestAdmitDecisionAllocatesNoMoreThanAdmit: returning the decision costs
// no allocation on the fast path (a free slot).
func TestAdmitDecisionAllocatesNoMoreThanAdmit(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	defer ctrl.Close()
	ctx := context.Background()
	r := admission.Request{Method: "/demo.Jobs/Run", Size: 128}
	admit := testing.AllocsPerRun(100, func() {
		p, _ := ctrl.Admit(ctx, r)
		p.Release()
	})
	decide := testing.AllocsPerRun(100, func() {
		p, _, _ := ctrl.AdmitDecision(ctx, r)
		p.Release()
	})
	require.Equal(t, admit, decide)
}

// BenchmarkAdmitDecision is BenchmarkAdmitRelease/noop/uncontended through
// AdmitDecision.
func BenchmarkAdmitDecision(b *testing.B) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "a", Slots: 1 << 20, QueueItems: 16}))
	if err != nil {
		b.Fatal(err)
	}
	defer ctrl.Close()
	ctx := context.Background()
	r := admission.Request{Method: "/demo.Jobs/Heavy", Tenant: "t", Size: 128}
	b.ReportAllocs()
	for b.Loop() {
		p, _, err := ctrl.AdmitDecision(ctx, r)
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
}

// TestAdmitDecisionAtDecidesAtTheGivenTime: AdmitDecisionAt judges the
// request's deadline against the time it is given, not the wall clock, and
// reports the decision as AdmitDecision does.
func TestAdmitDecisionAtDecidesAtTheGivenTime(t *testing.T) {
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	now := time.Now()
	r := work("/demo.Jobs/Run")
	r.Deadline = now.Add(time.Hour)

	p, d, err := c.AdmitDecisionAt(context.Background(), r, now)
	require.NoError(t, err)
	require.Equal(t, admission.Decision{Class: "work"}, d)
	p.ReleaseAt(now)

	_, d, err = c.AdmitDecisionAt(context.Background(), r, now.Add(2*time.Hour))
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason, "two hours on, the hour-long deadline has passed")
	require.Equal(t, "work", d.Class)
}

package admission_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

const (
	heavyM   = "/demo.Jobs/Heavy"
	lightM   = "/demo.Jobs/Light"
	healthM  = "/grpc.health.v1.Health/Check"
	attemptM = "/tollgate.v1.AttemptService/FenceAttempt"
)

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name string
		opts []admission.Option
		want string
	}{
		{"zero slots", []admission.Option{admission.WithClasses(admission.Class{Name: "a"})}, "Slots must be at least 1"},
		{"empty name", []admission.Option{admission.WithClasses(admission.Class{Slots: 1})}, "empty name"},
		{"twice", []admission.Option{admission.WithClasses(admission.Class{Name: "a", Slots: 1}, admission.Class{Name: "a", Slots: 1})}, "configured twice"},
		{"negative queue", []admission.Option{admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: -1})}, "negative limit"},
		{"expected over cap", []admission.Option{admission.WithClasses(admission.Class{Name: "a", Slots: 1, ExpectedServiceTime: 2, MaxServiceTime: 1})}, "exceeds MaxServiceTime"},
		{"optional control", []admission.Option{admission.WithClasses(admission.Class{Name: "control", Slots: 1, Optional: true})}, "cannot be optional"},
		{"unknown default", []admission.Option{admission.WithDefaultClass("nope")}, "default class \"nope\""},
		{"unknown pattern class", []admission.Option{admission.WithMethods("nope", "/a.B/")}, "unknown class"},
		{"bad pattern", []admission.Option{admission.WithMethods("default", "a.B/")}, "must start with"},
		{"margin", []admission.Option{admission.WithSafetyMargin(-1)}, "negative safety margin"},
		{"ttl", []admission.Option{admission.WithMaxOverrideTTL(-1)}, "override TTL"},
		{"rate", []admission.Option{admission.WithLearningRate(2)}, "learning rate"},
		{"ratio", []admission.Option{admission.WithDegradation(admission.Degradation{MaxRefusalRatio: 2})}, "MaxRefusalRatio"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := admission.New(tt.opts...)
			require.Nil(t, c)
			require.ErrorContains(t, err, tt.want)
			require.ErrorContains(t, err, "admission: ")
			require.ErrorIs(t, err, admission.ErrInvalidConfig)
		})
	}
}

func TestDefaults(t *testing.T) {
	c, err := admission.New()
	require.NoError(t, err)
	defer c.Close()
	s := c.Stats()
	require.Equal(t, admission.ModeNormal, s.Mode)
	ctl, ok := s.Class(admission.ControlClass)
	require.True(t, ok)
	require.Equal(t, 2, ctl.Slots)
	def, ok := s.Class(admission.DefaultClass)
	require.True(t, ok)
	require.Equal(t, 64, def.Slots)
	require.Equal(t, 256, def.QueueLimit)
	p, err := c.Admit(context.Background(), work(heavyM))
	require.NoError(t, err)
	require.Equal(t, admission.DefaultClass, p.Class())
	p.Release()
}

func TestClassification(t *testing.T) {
	c, err := admission.New(
		admission.WithClasses(
			admission.Class{Name: "bulk", Slots: 1},
			admission.Class{Name: "svc", Slots: 1},
			admission.Class{Name: "exact", Slots: 1},
			admission.Class{Name: "prefix", Slots: 1},
			admission.Class{Name: "critical", Slots: 1},
		),
		admission.WithMethods("svc", "/demo.Jobs/"),
		admission.WithMethods("exact", lightM),
		admission.WithMethods("prefix", "/demo.*"),
		admission.WithClassifier(func(ctx context.Context, r admission.Request) string {
			if r.Tenant == "vip" {
				return "critical"
			}
			return ""
		}),
	)
	require.NoError(t, err)
	defer c.Close()
	for _, tt := range []struct{ method, tenant, class string }{
		{heavyM, "", "svc"},
		{lightM, "", "exact"},
		{"/demo.Other/X", "", "prefix"},
		{"/zzz.Other/X", "", "bulk"},
		{heavyM, "vip", "critical"},
		{healthM, "vip", admission.ControlClass},
		{attemptM, "", admission.ControlClass},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "", admission.ControlClass},
		{"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "", admission.ControlClass},
		// A data service named like a control one is data.
		{"/grpc.reflection.v1.ServerReflectionX/Info", "", "bulk"},
		{"/grpc.health.v1.HealthX/Check", "", "bulk"},
	} {
		p, err := c.Admit(context.Background(), admission.Request{Method: tt.method, Tenant: tt.tenant, Size: -1})
		require.NoError(t, err, tt.method)
		require.Equal(t, tt.class, p.Class(), tt.method)
		p.Release()
	}
}

func TestWithoutControlClass(t *testing.T) {
	c, err := admission.New(admission.WithoutControlClass())
	require.NoError(t, err)
	defer c.Close()
	_, ok := c.Stats().Class(admission.ControlClass)
	require.False(t, ok)
	p, err := c.Admit(context.Background(), work(healthM))
	require.NoError(t, err)
	require.Equal(t, admission.DefaultClass, p.Class())
	p.Release()
}

func TestSlotsQueueFIFOAndBounds(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "heavy", Slots: 2, QueueItems: 2}))
	p1 := h.admitted(work(heavyM))
	p2 := h.admitted(work(heavyM))
	q1 := h.queued(work(heavyM))
	q2 := h.queued(work(heavyM))
	err := h.refused(work(heavyM), status.ReasonQueueFull)
	ra, ok := status.RetryAfter(err)
	require.True(t, ok)
	require.Positive(t, ra)
	st, _ := grpcstatus.FromError(err)
	require.Equal(t, codes.ResourceExhausted, st.Code())
	require.Equal(t, "heavy", status.OutcomeOf(err).Detail.GetWorkloadClass())

	evs := h.release(p1)
	require.Equal(t, admission.EventStarted, evs[len(evs)-1].Kind)
	r1 := h.take(q1)
	require.NoError(t, r1.err, "FIFO: the first waiter starts first")
	h.release(p2)
	r2 := h.take(q2)
	require.NoError(t, r2.err)
	h.release(r1.permit)
	h.release(r2.permit)
	s, _ := h.ctrl.Stats().Class("heavy")
	require.Zero(t, s.UsedSlots)
	require.Zero(t, s.Queued)
	require.EqualValues(t, 4, s.Admitted)
	require.EqualValues(t, 1, s.Refused["QUEUE_FULL"])
}

func TestNoQueueIsConcurrencyFull(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1}))
	p := h.admitted(work(heavyM))
	h.refused(work(heavyM), status.ReasonConcurrencyFull)
	h.release(p)
	h.release(h.admitted(work(heavyM)))
}

func TestQueueBytes(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 10, QueueBytes: 100}))
	p := h.admitted(admission.Request{Method: heavyM, Size: 1000}) // running bytes are not queue bytes
	q := h.queued(admission.Request{Method: heavyM, Size: 60})
	h.refused(admission.Request{Method: heavyM, Size: 41}, status.ReasonQueueFull)
	q2 := h.queued(admission.Request{Method: heavyM, Size: 40})
	q3 := h.queued(admission.Request{Method: heavyM, Size: -1}) // unknown size counts 0
	s, _ := h.ctrl.Stats().Class("a")
	require.EqualValues(t, 100, s.QueuedBytes)
	for _, id := range []int{q, q2, q3} {
		r := h.cancel(id)
		require.ErrorIs(t, r.err, context.Canceled)
		require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(r.err).Kind)
	}
	s, _ = h.ctrl.Stats().Class("a")
	require.Zero(t, s.Queued)
	require.Zero(t, s.QueuedBytes)
	h.release(p)
}

func TestSizeStage(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, MaxRequestBytes: 10}))
	err := h.refused(admission.Request{Method: heavyM, Size: 11}, status.ReasonRequestTooLarge)
	require.True(t, status.IsFinal(err))
	h.release(h.admitted(admission.Request{Method: heavyM, Size: 10}))
	h.release(h.admitted(admission.Request{Method: heavyM, Size: -1}))

	off := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, MaxRequestBytes: 10}),
		admission.WithStages(admission.AllStages&^admission.StageSize))
	off.release(off.admitted(admission.Request{Method: heavyM, Size: 11}))
}

func TestDeadlineStage(t *testing.T) {
	const tick = time.Second
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 10, ExpectedServiceTime: tick}))
	now := h.clk.Now()

	// Already past: expired, final, no retry-after.
	err := h.refused(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(-time.Nanosecond)}, status.ReasonDeadlineExpired)
	require.True(t, status.IsFinal(err))
	// Would finish exactly at its deadline: admitted.
	p := h.admitted(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(tick)})
	// Behind one running second-long job, a job due in 1.5s cannot make it.
	err = h.refused(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(tick + tick/2)}, status.ReasonDeadlineUnreachable)
	ra, ok := status.RetryAfter(err)
	require.True(t, ok)
	require.GreaterOrEqual(t, ra, tick/2, "retry-after reflects the predicted wait of about 1s")
	require.Less(t, ra, 2*tick)
	// Due in exactly 2s: 1s wait + 1s service, admitted to the queue.
	q := h.queued(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(2 * tick)})
	// Due in 3s behind 2s of predicted work: fits exactly too.
	q2 := h.queued(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(3 * tick)})
	h.refused(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(3*tick - 1)}, status.ReasonDeadlineUnreachable)

	// The running job overruns to 1.5s: q can no longer finish by 2s and is
	// dropped unrun at dequeue; q2 (due at 3s) still fits and starts.
	h.clk.Advance(tick + tick/2)
	evs := h.release(p)
	kinds := []admission.EventKind{}
	for _, e := range evs {
		kinds = append(kinds, e.Kind)
	}
	require.ElementsMatch(t, []admission.EventKind{admission.EventReleased, admission.EventDropped, admission.EventStarted}, kinds)
	rq := h.take(q)
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(rq.err).Reason)
	require.True(t, status.IsFinal(rq.err))
	r2 := h.take(q2)
	require.NoError(t, r2.err)
	// It finishes late too: with p (due at 1s, done at 1.5s) two false accepts.
	h.clk.Advance(2 * tick)
	h.release(r2.permit)
	s, _ := h.ctrl.Stats().Class("a")
	require.EqualValues(t, 2, s.FalseAccepts)

	// Stage off: nothing about deadlines is checked on arrival.
	off := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, ExpectedServiceTime: tick}),
		admission.WithStages(admission.AllStages&^(admission.StageDeadline|admission.StageDequeue)))
	off.release(off.admitted(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(-time.Hour)}))
}

func TestDequeueDropsExpired(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 4}))
	now := h.clk.Now()
	p := h.admitted(work(heavyM))
	q := h.queued(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(time.Second)})
	q2 := h.queued(work(heavyM))
	h.clk.Advance(2 * time.Second)
	h.release(p)
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(h.take(q).err).Reason)
	r := h.take(q2)
	require.NoError(t, r.err)
	h.release(r.permit)
}

func TestReleaseExactlyOnce(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 1}))
	p := h.admitted(work(heavyM))
	q := h.queued(work(heavyM))
	h.release(p)
	r := h.take(q)
	require.NoError(t, r.err)
	// A second release of p must not free r's slot.
	require.Empty(t, h.release(p))
	s, _ := h.ctrl.Stats().Class("a")
	require.Equal(t, 1, s.UsedSlots)
	h.release(r.permit)
	h.release(r.permit)
	s, _ = h.ctrl.Stats().Class("a")
	require.Zero(t, s.UsedSlots)
	var nilPermit *admission.Permit
	nilPermit.Release()
}

func TestLendingOnlyWhenConfigured(t *testing.T) {
	h := newHarness(t, admission.WithClasses(
		admission.Class{Name: "a", Slots: 1, QueueItems: 1},
		admission.Class{Name: "lender", Slots: 1, LendIdle: true},
		admission.Class{Name: "keeper", Slots: 1},
	), admission.WithMethods("lender", lightM), admission.WithMethods("keeper", "/demo.Keep/"))
	p := h.admitted(work(heavyM))
	// a borrows the lender's idle slot, never the keeper's.
	b := h.admitted(work(heavyM))
	q := h.queued(work(heavyM))
	s := h.ctrl.Stats()
	l, _ := s.Class("lender")
	require.Equal(t, 1, l.UsedSlots)
	k, _ := s.Class("keeper")
	require.Zero(t, k.UsedSlots)
	// The lender's own request finds its slot lent out: it is refused, the
	// lender has no queue.
	h.refused(work(lightM), status.ReasonConcurrencyFull)
	h.release(b) // the lender's slot goes to the waiting a request: lender has no waiters
	r := h.take(q)
	require.NoError(t, r.err)
	h.release(p)
	h.release(r.permit)
	kp := h.admitted(work("/demo.Keep/X"))
	h.release(kp)
}

func TestTenantLimits(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{
		Name: "a", Slots: 3, QueueItems: 10, TenantRunning: 1, TenantQueued: 2,
	}))
	ra := func() admission.Request { return admission.Request{Method: heavyM, Tenant: "A", Size: -1} }
	rb := func() admission.Request { return admission.Request{Method: heavyM, Tenant: "B", Size: -1} }
	pa := h.admitted(ra())
	qa1 := h.queued(ra()) // A runs its one, waits although slots are free
	qa2 := h.queued(ra())
	h.refused(ra(), status.ReasonTenantLimit)
	pb := h.admitted(rb()) // B is not blocked behind A's waiters
	h.release(pa)
	r := h.take(qa1)
	require.NoError(t, r.err)
	s, _ := h.ctrl.Stats().Class("a")
	require.Equal(t, 1, s.Tenants["A"].Running)
	require.Equal(t, 1, s.Tenants["A"].Queued)
	h.release(r.permit)
	r2 := h.take(qa2)
	require.NoError(t, r2.err)
	h.release(r2.permit)
	h.release(pb)
	s, _ = h.ctrl.Stats().Class("a")
	require.Empty(t, s.Tenants, "idle tenants are forgotten")
}

func TestLearnedServiceTime(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{
		Name: "a", Slots: 1, ExpectedServiceTime: 100 * time.Millisecond, MaxServiceTime: time.Second,
	}))
	s, _ := h.ctrl.Stats().Class("a")
	require.Equal(t, 100*time.Millisecond, s.ServiceMean)
	require.Equal(t, 100*time.Millisecond, s.ServiceP95)
	for range 50 {
		p := h.admitted(work(heavyM))
		h.clk.Advance(200 * time.Millisecond)
		h.release(p)
	}
	s, _ = h.ctrl.Stats().Class("a")
	require.InDelta(t, 200*time.Millisecond, s.ServiceMean, float64(5*time.Millisecond))
	require.InDelta(t, 200*time.Millisecond, s.ServiceP95, float64(5*time.Millisecond))
	// Observations are capped.
	for range 50 {
		p := h.admitted(work(heavyM))
		h.clk.Advance(time.Hour)
		h.release(p)
	}
	s, _ = h.ctrl.Stats().Class("a")
	require.LessOrEqual(t, s.ServiceMean, time.Second)
	require.LessOrEqual(t, s.ServiceP95, time.Second)
}

func TestRetryAfterJitteredAndReflectsQueue(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}))
	p := h.admitted(work(heavyM))
	var ids []int
	for range 4 {
		ids = append(ids, h.queued(work(heavyM)))
	}
	seen := map[time.Duration]bool{}
	for range 20 {
		ra, ok := status.RetryAfter(h.refused(work(heavyM), status.ReasonQueueFull))
		require.True(t, ok)
		// 4 queued seconds + 1 running second over one slot: about 5s, ±50%.
		require.GreaterOrEqual(t, ra, 2500*time.Millisecond)
		require.Less(t, ra, 7500*time.Millisecond)
		seen[ra] = true
	}
	require.Greater(t, len(seen), 10, "retry-after is jittered, never a constant")
	for _, id := range ids {
		h.cancel(id)
	}
	h.release(p)
}

func TestWaiterLeavesWhenContextEnds(t *testing.T) {
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 1}))
	require.NoError(t, err)
	defer c.Close()
	p, err := c.Admit(context.Background(), work(heavyM))
	require.NoError(t, err)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err = c.Admit(ctx, work(heavyM))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind)
	p.Release()
}

func TestCloseDrains(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 1}))
	p := h.admitted(work(heavyM))
	q := h.queued(work(heavyM))
	require.NoError(t, h.ctrl.Close())
	h.drain()
	require.Equal(t, status.ReasonDraining, status.OutcomeOf(h.take(q).err).Reason)
	h.refused(work(heavyM), status.ReasonDraining)
	h.release(p)
	require.NoError(t, h.ctrl.Close())
}

// deadlineCtx is a context whose end the test controls and which ends with
// DeadlineExceeded, as a gRPC deadline does.
type deadlineCtx struct {
	context.Context
	done chan struct{}
}

func (c *deadlineCtx) Done() <-chan struct{} { return c.done }
func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func TestWaiterDeadlineEndsWait(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 1}))
	p := h.admitted(work(heavyM))
	ctx := &deadlineCtx{Context: context.Background(), done: make(chan struct{})}
	res := make(chan error, 1)
	go func() {
		_, err := h.ctrl.Admit(ctx, work(heavyM))
		res <- err
	}()
	require.Equal(t, admission.EventQueued, next(h.events, decided...).Kind)
	close(ctx.done)
	e := next(h.events, admission.EventDropped)
	require.Equal(t, status.ReasonDeadlineExpired, e.Reason)
	err := <-res
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason)
	s, _ := h.ctrl.Stats().Class("a")
	require.Zero(t, s.Queued)
	h.release(p)
}

func TestAdmitFastPathAllocations(t *testing.T) {
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "a", Slots: 4, QueueItems: 4, TenantRunning: 4}))
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	r := admission.Request{Method: heavyM, Tenant: "t", Size: 10, Deadline: time.Now().Add(time.Hour)}
	n := testing.AllocsPerRun(200, func() {
		p, err := c.Admit(ctx, r)
		if err != nil {
			panic(err)
		}
		p.Release()
	})
	require.LessOrEqual(t, n, 2.0, "allocations per admitted call")
}

func TestFalseRejectsJudgedFromLaterStarts(t *testing.T) {
	h := newHarness(t, admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second}),
		admission.WithStages(admission.AllStages&^admission.StageDegradation))
	now := h.clk.Now()
	p := h.admitted(work(heavyM))
	// Predicted: about 1s of running work ahead + 1s of its own: refused.
	h.refused(admission.Request{Method: heavyM, Size: -1, Deadline: now.Add(1500 * time.Millisecond)}, status.ReasonDeadlineUnreachable)
	q := h.queued(work(heavyM))
	// The running job ends at once: q starts at 10ms, so the refused job,
	// which was ahead of it, would have finished by 1.01s: a false reject.
	h.clk.Advance(10 * time.Millisecond)
	h.release(p)
	r := h.take(q)
	require.NoError(t, r.err)
	h.release(r.permit)
	s, _ := h.ctrl.Stats().Class("a")
	require.EqualValues(t, 1, s.FalseRejects)
	require.Zero(t, s.FalseAccepts)
}

// Regression tests for the defects of review 3. They run on a virtual clock
// and assert on decisions and counts, never on elapsed time.

func newCtl(t *testing.T, clk *clock, opts ...admission.Option) *admission.Controller {
	t.Helper()
	c, err := admission.New(append([]admission.Option{admission.WithClock(clk.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// R4 (P0-2): one huge service-time sample (there was no MaxServiceTime by
// default) poisoned the estimator; with the deadline stage every later request
// was refused DEADLINE_UNREACHABLE even on an idle class, so nothing ever
// completed and the estimate never recovered. Now the sample is capped and an
// idle class admits a probe on ExpectedServiceTime.
func TestEstimatorPoisonLocksClassOut(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 8, QueueItems: 8, ExpectedServiceTime: 10 * time.Millisecond}))
	p, err := c.Admit(context.Background(), work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour) // e.g. a long-lived stream or a hung handler in the class
	p.Release()
	for i := range 1000 {
		clk.Advance(time.Second)
		r := work("/s.S/M")
		r.Deadline = clk.Now().Add(5 * time.Second)
		p, err := c.Admit(context.Background(), r)
		if err == nil {
			clk.Advance(10 * time.Millisecond)
			p.Release()
			return
		}
		if i == 999 {
			st, _ := c.Stats().Class("w")
			t.Fatalf("idle class refuses every 5s-deadline request for 1000s: %v (mean %v p95 %v, running %d)",
				status.ReasonName(status.OutcomeOf(err).Reason), st.ServiceMean, st.ServiceP95, st.Running)
		}
	}
}

// R8 (P2-9): permits ended without real work (refused/replayed after
// admission) taught ~0 service time: 20 such releases erased a 1s estimate.
// Abandon gives the slot back without teaching the estimator.
func TestEstimatorPoisonedByInstantReleases(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 8, QueueItems: 8, ExpectedServiceTime: time.Second}))
	for range 20 {
		p, _ := c.Admit(context.Background(), work("/s.S/M"))
		p.Abandon() // e.g. interceptor: beginTry answered from the record after the permit was taken
	}
	st, _ := c.Stats().Class("w")
	if st.ServiceMean < 100*time.Millisecond {
		t.Fatalf("service mean fell from 1s to %v (p95 %v) with no real work", st.ServiceMean, st.ServiceP95)
	}
}

// Abandon and Release end a permit exactly once together, whichever comes
// first; both are nil-safe, and so is Class.
func TestAbandonExactlyOnce(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 1, ExpectedServiceTime: time.Second}))
	var nilPermit *admission.Permit
	nilPermit.Abandon()
	nilPermit.Release()
	if got := nilPermit.Class(); got != "" {
		t.Fatalf("nil permit's class %q", got)
	}
	for _, abandonFirst := range []bool{true, false} {
		p, err := c.Admit(context.Background(), work("/s.S/M"))
		if err != nil {
			t.Fatal(err)
		}
		if p.Class() != "w" {
			t.Fatalf("class %q", p.Class())
		}
		clk.Advance(time.Hour)
		if abandonFirst {
			p.Abandon()
			p.Release()
		} else {
			p.Release()
			p.Abandon()
		}
		p.Abandon()
		st, _ := c.Stats().Class("w")
		if st.UsedSlots != 0 || st.Running != 0 {
			t.Fatalf("abandonFirst=%v: %d used, %d running after ending twice", abandonFirst, st.UsedSlots, st.Running)
		}
		if abandonFirst && st.ServiceMean != time.Second {
			t.Fatalf("abandoned permit taught the estimator: mean %v", st.ServiceMean)
		}
	}
	// The one Release (an hour, capped at DefaultMaxServiceTime) moved the
	// estimate by a bounded step.
	st, _ := c.Stats().Class("w")
	if st.ServiceMean > admission.DefaultMaxServiceTime || st.ServiceP95 > admission.DefaultMaxServiceTime {
		t.Fatalf("estimate above the default cap: mean %v p95 %v", st.ServiceMean, st.ServiceP95)
	}
}

// One huge sample after many ordinary ones is clipped at 4 × p95.
func TestEstimatorClipsOutlier(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 1, ExpectedServiceTime: 100 * time.Millisecond}))
	for range 30 {
		p, err := c.Admit(context.Background(), work("/s.S/M"))
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(100 * time.Millisecond)
		p.Release()
	}
	p, _ := c.Admit(context.Background(), work("/s.S/M"))
	clk.Advance(50 * time.Second)
	p.Release()
	st, _ := c.Stats().Class("w")
	// Clipped to 400ms: mean ≤ 100ms + 0.2 × 300ms.
	if st.ServiceMean > 200*time.Millisecond {
		t.Fatalf("one 50s sample moved the mean to %v", st.ServiceMean)
	}
}

// R13 (P1-3): refusals made by the tap are invisible to the degradation windows:
// with the tap installed (interceptor default) a saturated class whose
// arrivals are all refused early never makes a window overloaded.
func TestTapRefusalsInvisibleToDegradation(t *testing.T) {
	for _, viaTap := range []bool{false, true} {
		clk := newClock()
		c := newCtl(t, clk,
			admission.WithClasses(admission.Class{Name: "main", Slots: 1, QueueItems: 1},
				admission.Class{Name: "opt", Slots: 8, Optional: true}),
			admission.WithMethods("opt", "/demo.Opt/"))
		ctx, cancel := context.WithCancel(context.Background())
		p, _ := c.Admit(ctx, work("/demo.Main/Do"))
		go c.Admit(ctx, work("/demo.Main/Do"))
		for c.Stats().Classes[1].Queued < 1 {
			time.Sleep(time.Millisecond)
		}
		refused := 0
		for range 100 {
			var err error
			if viaTap {
				_, err = c.TapHandle(ctx, &tap.Info{FullMethodName: "/demo.Main/Do"})
			} else {
				_, err = c.Admit(ctx, work("/demo.Main/Do"))
			}
			if err != nil {
				refused++
			}
		}
		clk.Advance(time.Second)
		t.Logf("viaTap=%v: %d/100 refused QUEUE_FULL, mode after the window: %v", viaTap, refused, c.Mode())
		if viaTap && c.Mode() == admission.ModeNormal {
			t.Errorf("100%% of arrivals refused by the tap, mode stays NORMAL")
		}
		if st, _ := c.Stats().Class("main"); st.Refused["QUEUE_FULL"] < 100 {
			t.Errorf("viaTap=%v: Stats counts %d QUEUE_FULL refusals of 100", viaTap, st.Refused["QUEUE_FULL"])
		}
		cancel()
		p.Release()
	}
}

// R11 (P1-4): one tenant sending already-expired (or unreachable) requests to an
// idle server makes the window "overloaded": the controller degrades and
// sheds every tenant's optional class, with no capacity pressure at all.
func TestExpiredArrivalsDegradeIdleServer(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 8, QueueItems: 8, TenantQueued: 1},
			admission.Class{Name: "opt", Slots: 8, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"))
	for range 20 {
		r := admission.Request{Method: "/demo.Main/Do", Tenant: "evil", Size: -1, Deadline: clk.Now().Add(-time.Millisecond)}
		_, _ = c.Admit(context.Background(), r)
	}
	clk.Advance(time.Second)
	_, err := c.Admit(context.Background(), admission.Request{Method: "/demo.Opt/Do", Tenant: "good", Size: -1})
	st, _ := c.Stats().Class("main")
	t.Logf("main running %d queued %d; mode %v", st.Running, st.Queued, c.Mode())
	if err != nil {
		t.Fatalf("idle server sheds tenant good's optional request: %v", err)
	}
}

// P1-4: deadlines too short for the service time even without a wait are the
// caller's problem too; they do not degrade an idle server.
func TestUnreachableWithoutWaitDoesNotDegrade(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 8, QueueItems: 8, ExpectedServiceTime: time.Second},
			admission.Class{Name: "opt", Slots: 8, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"))
	for range 50 {
		r := admission.Request{Method: "/demo.Main/Do", Size: -1, Deadline: clk.Now().Add(time.Millisecond)}
		_, err := c.Admit(context.Background(), r)
		if o := status.OutcomeOf(err); o.Reason != status.ReasonDeadlineUnreachable {
			t.Fatalf("reason %v, want DEADLINE_UNREACHABLE", status.ReasonName(o.Reason))
		}
	}
	clk.Advance(time.Second)
	if m := c.Mode(); m != admission.ModeNormal {
		t.Fatalf("idle server degraded by short deadlines: %v", m)
	}
	if st, _ := c.Stats().Class("main"); st.Refused["DEADLINE_UNREACHABLE"] != 50 {
		t.Fatalf("stats count %d refusals of 50", st.Refused["DEADLINE_UNREACHABLE"])
	}
}

// R3 (P1-5): lending bypasses an override that lowers a class's slots.
func TestLendingBypassesSlotOverride(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "a", Slots: 4}, admission.Class{Name: "b", Slots: 4, LendIdle: true}),
		admission.WithMethods("b", "/b.B/"))
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "lower a", TTL: time.Minute, Class: "a", Slots: 1}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for range 5 {
		if p, err := c.Admit(context.Background(), work("/a.A/M")); err == nil {
			defer p.Release()
			n++
		}
	}
	if n > 1 {
		t.Fatalf("class a lowered to 1 slot by the operator runs %d requests", n)
	}
}

// R3b (P1-5): in Recovering an optional class borrows lenders' idle slots, bypassing
// the stepped re-admission (⌈Slots·h/ExitAfter⌉).
func TestRecoveringStepBypassedByLending(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 8, LendIdle: true},
			admission.Class{Name: "opt", Slots: 6, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"))
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Minute, Mode: admission.ModeRecovering}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for range 20 {
		if p, err := c.Admit(context.Background(), work("/demo.Opt/Do")); err == nil {
			defer p.Release()
			n++
		}
	}
	st, _ := c.Stats().Class("opt")
	if n > st.Slots {
		t.Fatalf("recovering optional class stepped to %d slots runs %d requests", st.Slots, n)
	}
}

// R2 (P1-6): an override that lowers QueueItems leaves the queue above the new bound.
func TestOverrideLowersQueueBelowQueued(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 1, QueueItems: 4}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := c.Admit(ctx, work("/s.S/M"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	for range 4 {
		go c.Admit(ctx, work("/s.S/M"))
	}
	for c.Stats().Classes[1].Queued < 4 {
		time.Sleep(time.Millisecond)
	}
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Minute, Class: "w", QueueItems: 1}); err != nil {
		t.Fatal(err)
	}
	st, _ := c.Stats().Class("w")
	if st.Queued > st.QueueLimit {
		t.Fatalf("queued %d > effective queue bound %d after override", st.Queued, st.QueueLimit)
	}
	if st.Refused["QUEUE_FULL"] != 3 {
		t.Fatalf("%d waiters refused QUEUE_FULL, want the 3 newest", st.Refused["QUEUE_FULL"])
	}
}

// R1 (P2-7): an override that freezes a class is enforced by the tap forever when the
// class's only traffic is refused at the tap: nothing calls advance, so the
// override never expires and the tap flag is never refreshed.
func TestTapOverrideNeverExpires(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "batch", Slots: 2, QueueItems: 2}))
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Second, Class: "batch", Freeze: true}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour) // TTL long gone
	_, err := c.TapHandle(context.Background(), &tap.Info{FullMethodName: "/svc.S/M"})
	if err != nil {
		t.Fatalf("tap still refuses an hour after a 1s override expired: %v", err)
	}
	// The request the tap let through reaches Admit, which expires the
	// override; the tap's flag is then open for good.
	p, err := c.Admit(context.Background(), work("/svc.S/M"))
	if err != nil {
		t.Fatalf("Admit after the override expired: %v", err)
	}
	p.Release()
	if _, err := c.TapHandle(context.Background(), &tap.Info{FullMethodName: "/svc.S/M"}); err != nil {
		t.Fatalf("tap refuses after Admit expired the override: %v", err)
	}
}

// P2-7: while an override is in force the tap refuses; only past its expiry
// does it let requests through.
func TestTapRefusesUntilOverrideExpires(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "batch", Slots: 2, QueueItems: 2}))
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Minute, Class: "batch", Freeze: true}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(59 * time.Second)
	if _, err := c.TapHandle(context.Background(), &tap.Info{FullMethodName: "/svc.S/M"}); status.OutcomeOf(err).Reason != status.ReasonShed {
		t.Fatalf("tap during the freeze: %v, want SHED", err)
	}
	if n := len(c.Overrides()); n != 1 {
		t.Fatalf("%d overrides in force, want 1", n)
	}
}

// R1b (P2-7): Overrides() reports an expired override as in force.
func TestOverridesListsExpired(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk)
	if _, err := c.SetOverride(context.Background(), admission.Override{Actor: "op", Reason: "r", TTL: time.Second, Class: "default", Slots: 1}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if n := len(c.Overrides()); n != 0 {
		t.Fatalf("Overrides() lists %d override(s) an hour after a 1s TTL", n)
	}
}

// R7 (P2-8): the summed remaining-work estimate lets one overdue request cancel the
// remaining work of the others: a full class predicts a zero wait.
func TestPredictedWaitCancelsOut(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 2, QueueItems: 2, ExpectedServiceTime: time.Second}))
	p1, _ := c.Admit(context.Background(), work("/s.S/M"))
	defer p1.Release()
	clk.Advance(10 * time.Second) // p1 overdue by 9s
	p2, _ := c.Admit(context.Background(), work("/s.S/M"))
	defer p2.Release()
	st, _ := c.Stats().Class("w")
	t.Logf("running %d/%d, predicted wait %v", st.Running, st.Slots, st.PredictedWait)
	// per-request clamp: (max(1s-10s, 0.1s) + max(1s-0, 0.1s)) / 2 = 550ms
	if st.PredictedWait != 550*time.Millisecond {
		t.Fatalf("full class predicts wait %v, want 550ms: p2 alone has 1s left on 2 slots", st.PredictedWait)
	}
	r := work("/s.S/M")
	r.Deadline = clk.Now().Add(1100 * time.Millisecond)
	_, err := c.Admit(context.Background(), r)
	if o := status.OutcomeOf(err); o.Reason != status.ReasonDeadlineUnreachable {
		t.Fatalf("request needing 1s after a 550ms wait with 1.1s left: %v, want DEADLINE_UNREACHABLE", err)
	}
	// Both overdue: a full class still predicts a wait.
	clk.Advance(10 * time.Second)
	if st, _ := c.Stats().Class("w"); st.PredictedWait <= 0 {
		t.Fatalf("full class of overdue requests predicts wait %v", st.PredictedWait)
	}
}

// R10 (P3-11): under an O,H oscillation the optional class is re-admitted and shed
// again every window (mode changes every window), flushing its queue each time.
func TestDegradedRecoveringFlap(t *testing.T) {
	h := degradeHarness(t, 1, 3)
	var modes []string
	for i := range 12 {
		modes = append(modes, h.window(i%2 == 0).String())
	}
	tr := h.ctrl.Stats().Transitions
	t.Logf("modes %v, transitions %d in 12 windows", modes, tr)
	if tr > 12/3+1 {
		t.Fatalf("optional-class capacity changed %d times in 12 windows (exit period 3)", tr)
	}
}

// P3-11: after falling back from Recovering the controller holds Degraded for
// the exit period, then recovers in steps as usual.
func TestDegradedHoldsAfterReentry(t *testing.T) {
	h := degradeHarness(t, 1, 3)
	want := []admission.Mode{
		admission.ModeDegraded,   // O
		admission.ModeRecovering, // H
		admission.ModeDegraded,   // O: re-entry
		admission.ModeDegraded,   // H 1 of 3: held
		admission.ModeDegraded,   // H 2 of 3: held
		admission.ModeRecovering, // H 3 of 3: recover in steps
		admission.ModeRecovering, // H
		admission.ModeNormal,     // H
	}
	for i, w := range want {
		if m := h.window(i == 0 || i == 2); m != w {
			t.Fatalf("window %d: mode %v, want %v", i, m, w)
		}
	}
}

// R12 (P3-10): TENANT_LIMIT's retry-after reflects the class, not the tenant's own
// backlog: the tenant cannot be admitted for ~10s but is told ~2.5s.
func TestTenantLimitRetryAfter(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 8, QueueItems: 8, TenantRunning: 1, TenantQueued: 1, ExpectedServiceTime: 10 * time.Second}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := admission.Request{Method: "/s.S/M", Tenant: "A", Size: -1}
	p, _ := c.Admit(ctx, a)
	defer p.Release()
	go c.Admit(ctx, a)
	for c.Stats().Classes[1].Queued < 1 {
		time.Sleep(time.Millisecond)
	}
	// The tenant's one running request has 10s left on its running limit
	// of 1: every retry-after is jittered in [5s, 15s).
	for range 50 {
		_, err := c.Admit(ctx, a)
		if o := status.OutcomeOf(err); o.Reason != status.ReasonTenantLimit {
			t.Fatalf("reason %v, want TENANT_LIMIT", status.ReasonName(o.Reason))
		}
		if ra, _ := status.RetryAfter(err); ra < 5*time.Second || ra >= 15*time.Second {
			t.Fatalf("TENANT_LIMIT retry-after %v; tenant A's next queue place frees in ~10s", ra)
		}
	}
}

// R9: a waiter whose deadline passed keeps its queue place (no timer, no
// sweep on Admit): later useful work is refused QUEUE_FULL.
func TestExpiredWaiterHoldsQueue(t *testing.T) {
	for _, stages := range []admission.Stage{admission.AllStages, admission.AllStages &^ admission.StageDegradation} {
		expiredWaiterHoldsQueue(t, stages)
	}
}

func expiredWaiterHoldsQueue(t *testing.T, stages admission.Stage) {
	clk := newClock()
	c := newCtl(t, clk, admission.WithClasses(admission.Class{Name: "w", Slots: 1, QueueItems: 1, ExpectedServiceTime: 10 * time.Millisecond}), admission.WithStages(stages))
	p, _ := c.Admit(context.Background(), work("/s.S/M"))
	defer p.Release()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := work("/s.S/M")
	r.Deadline = clk.Now().Add(time.Second)
	go c.Admit(ctx, r)
	for c.Stats().Classes[1].Queued < 1 {
		time.Sleep(time.Millisecond)
	}
	clk.Advance(time.Hour)
	r2 := work("/s.S/M")
	r2.Deadline = clk.Now().Add(time.Hour)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	_, err := c.Admit(ctx2, r2)
	if o := status.OutcomeOf(err); o.Reason == status.ReasonQueueFull {
		t.Fatalf("useful request refused QUEUE_FULL: the only queue place is held by a waiter expired 1h ago")
	}
}

// P2-7: the tap's SHED for an optional class while Degraded does not outlive
// the healthy windows that end it when only the tap sees traffic.
func TestTapShedEndsWithDegradedWindows(t *testing.T) {
	clk := newClock()
	c := newCtl(t, clk,
		admission.WithClasses(admission.Class{Name: "main", Slots: 1},
			admission.Class{Name: "opt", Slots: 4, Optional: true}),
		admission.WithMethods("opt", "/demo.Opt/"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, MinDecisions: 2}))
	p, err := c.Admit(context.Background(), work("/demo.Main/Do"))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, _ = c.Admit(context.Background(), work("/demo.Main/Do")) // CONCURRENCY_FULL
	}
	p.Release()
	clk.Advance(time.Second)
	if m := c.Mode(); m != admission.ModeDegraded {
		t.Fatalf("mode %v, want DEGRADED", m)
	}
	info := &tap.Info{FullMethodName: "/demo.Opt/Do"}
	if _, err := c.TapHandle(context.Background(), info); status.OutcomeOf(err).Reason != status.ReasonShed {
		t.Fatalf("tap while degraded: %v, want SHED", err)
	}
	clk.Advance(10 * time.Second) // healthy windows nobody has closed yet
	if _, err := c.TapHandle(context.Background(), info); err != nil {
		t.Fatalf("tap still sheds after 10 healthy windows: %v", err)
	}
	q, err := c.Admit(context.Background(), work("/demo.Opt/Do"))
	if err != nil {
		t.Fatalf("Admit after the healthy windows: %v", err)
	}
	q.Release()
}

// A review found that the retry-after of a refusal had no upper bound: it is
// the class's predicted wait (jittered in [½, 1½) of it), so a class with
// long work and a deep queue told refused clients to come back in tens of
// minutes (the review saw 40), long after the queue it judged had changed,
// and the tap repeated the same prediction. Here one slot runs work learned
// at 10 minutes and four requests wait: the predicted wait is 50 minutes.
// Every suggestion — QUEUE_FULL from Admit and from the tap, TENANT_LIMIT,
// SHED in a window of 5 minutes — must stay below the bound in force
// (DefaultMaxRetryAfter, or WithMaxRetryAfter's), and still be jittered.
func TestRetryAfterIsBounded(t *testing.T) {
	for _, bound := range []time.Duration{0, 2 * time.Second} {
		t.Run(fmt.Sprint(bound), func(t *testing.T) {
			opts := []admission.Option{
				admission.WithClasses(
					admission.Class{Name: "w", Slots: 1, QueueItems: 4, ExpectedServiceTime: 10 * time.Minute,
						MaxServiceTime: time.Hour, TenantRunning: 1, TenantQueued: 1},
					admission.Class{Name: "opt", Slots: 1, Optional: true}),
				admission.WithMethods("opt", optM),
				admission.WithDegradation(admission.Degradation{Window: 5 * time.Minute}),
			}
			limit := admission.DefaultMaxRetryAfter
			if bound > 0 {
				opts = append(opts, admission.WithMaxRetryAfter(bound))
				limit = bound
			}
			h := newHarness(t, opts...)
			tenant := func(name string) admission.Request {
				r := work(heavyM)
				r.Tenant = name
				return r
			}
			p := h.admitted(tenant("A"))
			h.queued(tenant("A"))
			for _, name := range []string{"B", "C", "D"} {
				h.queued(tenant(name))
			}
			s, _ := h.ctrl.Stats().Class("w")
			require.Equal(t, 50*time.Minute, s.PredictedWait, "setup: 4 queued and 1 running of 10 minutes each on one slot")
			_, err := h.ctrl.SetOverride(context.Background(), admission.Override{
				Actor: "test", Reason: "shed opt", TTL: time.Minute, Class: "opt", Freeze: true})
			require.NoError(t, err)

			check := func(what string, err error, reason status.Reason, seen map[time.Duration]bool) {
				t.Helper()
				require.Equal(t, reason, status.OutcomeOf(err).Reason, "%s: %v", what, err)
				ra, ok := status.RetryAfter(err)
				require.True(t, ok, "%s carries a retry-after", what)
				require.Less(t, ra, limit, "%s: retry-after %v over the bound %v", what, ra, limit)
				require.GreaterOrEqual(t, ra, limit/3, "%s: the bound caps the suggestion, it does not shrink it further", what)
				seen[ra] = true
			}
			for _, c := range []struct {
				what   string
				reason status.Reason
				refuse func() error
			}{
				{"Admit QUEUE_FULL", status.ReasonQueueFull, func() error { return h.refused(tenant("E"), status.ReasonQueueFull) }},
				{"tap QUEUE_FULL", status.ReasonQueueFull, func() error {
					_, err := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: heavyM})
					return err
				}},
				{"TENANT_LIMIT", status.ReasonTenantLimit, func() error { return h.refused(tenant("A"), status.ReasonTenantLimit) }},
				{"SHED", status.ReasonShed, func() error { return h.refused(work(optM), status.ReasonShed) }},
			} {
				seen := map[time.Duration]bool{}
				for range 20 {
					check(c.what, c.refuse(), c.reason, seen)
				}
				require.Greater(t, len(seen), 10, "%s: retry-after is jittered, never a constant", c.what)
			}
			// What the interceptor suggests on the class's behalf
			// (Controller.RetryAfter) is bounded alike.
			seen := map[time.Duration]bool{}
			for range 20 {
				ra := h.ctrl.RetryAfter("w")
				require.Less(t, ra, limit)
				require.GreaterOrEqual(t, ra, limit/3)
				seen[ra] = true
			}
			require.Greater(t, len(seen), 10, "RetryAfter is jittered, never a constant")
			require.Less(t, h.ctrl.RetryAfter("no such class"), 15*time.Millisecond, "the floor, jittered")
			h.drain()
			h.release(p)
		})
	}
}

// A review found that the cap of the retry-after's base, ⅔ of the bound of
// WithMaxRetryAfter, was computed as bound*2/3, which overflows for a bound
// above half of time.Duration's range: a server that asked for no
// practical bound, WithMaxRetryAfter(math.MaxInt64), got a negative cap,
// and its first refusal panicked in the jitter (rand.N of a negative
// duration). It pins that such a bound is accepted and caps nothing: the
// suggestion is the predicted wait, jittered, as without a bound.
func TestRetryAfterHugeBound(t *testing.T) {
	for _, bound := range []time.Duration{math.MaxInt64, math.MaxInt64/2 + 1, 1<<62 + 7} {
		t.Run(fmt.Sprint(int64(bound)), func(t *testing.T) {
			h := newHarness(t, admission.WithMaxRetryAfter(bound),
				admission.WithClasses(admission.Class{Name: "w", Slots: 1, QueueItems: 1, ExpectedServiceTime: 10 * time.Minute,
					MaxServiceTime: time.Hour}))
			p := h.admitted(work(heavyM))
			h.queued(work(heavyM))
			for range 20 {
				err := h.refused(work(heavyM), status.ReasonQueueFull)
				ra, ok := status.RetryAfter(err)
				require.True(t, ok)
				// Predicted wait 20 minutes (one running, one queued), jittered.
				require.GreaterOrEqual(t, ra, 10*time.Minute)
				require.Less(t, ra, 30*time.Minute)
				ra = h.ctrl.RetryAfter("w")
				require.GreaterOrEqual(t, ra, 10*time.Minute)
				require.Less(t, ra, 30*time.Minute)
			}
			h.drain()
			h.release(p)
		})
	}
}

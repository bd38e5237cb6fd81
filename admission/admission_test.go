package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
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

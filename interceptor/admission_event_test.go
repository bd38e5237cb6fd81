package interceptor_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
)

// deadlockBound bounds every wait of the admission event test: it only
// turns a deadlock into a failure, it asserts nothing about speed.
const deadlockBound = 30 * time.Second

// within returns the next value of ch, failing the test if none comes
// within deadlockBound.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(deadlockBound)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("deadlock: no %s within %v", what, deadlockBound)
		panic("unreachable")
	}
}

// eventScene is the admission event tests' server: class "work" with one
// slot and three places, the admission tap off (the interceptor's
// admission step decides), and hold's handler, which keeps the slot for
// the key "hold". A server span, standing for otelgrpc's, names each
// request's key and is recorded in spans; a request keyed "late" runs on an
// endsPastDeadline context.
type eventScene struct {
	t      *testing.T
	spans  *tracetest.SpanRecorder
	events chan admission.Event // the controller's observer's
	ctrl   *admission.Controller
	hold   *slotHolder
	client testingv1.TestServiceClient // one try per call
}

// newEventScene starts an eventScene; spanEnded, if not nil, is called
// after each server span ended.
func newEventScene(t *testing.T, spanEnded func()) *eventScene {
	t.Helper()
	sc := &eventScene{t: t, spans: tracetest.NewSpanRecorder(), events: make(chan admission.Event, 64), hold: newSlotHolder()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sc.spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 3}),
		admission.WithDefaultClass("work"),
		admission.WithObserver(func(e admission.Event) { sc.events <- e }),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	sc.ctrl = ctrl

	withSpan := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, span := tp.Tracer("test").Start(ctx, info.FullMethod)
		defer func() {
			span.End()
			if spanEnded != nil {
				spanEnded()
			}
		}()
		span.SetAttributes(attribute.String("key", req.(*testingv1.GetRequest).GetKey()))
		if req.(*testingv1.GetRequest).GetKey() == "late" {
			ctx = endsPastDeadline{ctx}
		}
		return h(ctx, req)
	})
	svc := &testsvc.Service{GetFunc: sc.hold.get}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		append([]grpc.ServerOption{withSpan}, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap())...)...)
	sc.client = testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	return sc
}

// awaitEvent returns the controller's next event of kind, passing over
// the others.
func (sc *eventScene) awaitEvent(kind admission.EventKind) admission.Event {
	sc.t.Helper()
	for {
		if e := within(sc.t, sc.events, kind.String()+" event"); e.Kind == kind {
			return e
		}
	}
}

// TestAdmissionEventQueuedAheadCountsTheRequestsActuallyQueued: one slot,
// three places. A handler holds the slot on a channel; three requests are
// sent one at a time, each only once the one before it is in the queue (the
// controller's observer says so, and a snapshot confirms the queue's
// length); a fifth finds the queue full (the tap is off, so the
// interceptor's admission step refuses it). Each request's
// tollgate.admission event carries the number of requests that were
// actually queued ahead of it: 0 for the holder, 0, 1 and 2 for the waiters
// (reported when they start, after the holder is released), 3 for the
// refusal.
func TestAdmissionEventQueuedAheadCountsTheRequestsActuallyQueued(t *testing.T) {
	sc := newEventScene(t, nil)
	ctrl, client, spans, awaitEvent := sc.ctrl, sc.client, sc.spans, sc.awaitEvent
	queued := func() int {
		st, _ := ctrl.Stats().Class("work")
		return st.Queued
	}

	done := make(chan error, 4)
	send := func(key string) {
		go func() {
			_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: key})
			done <- err
		}()
	}
	send("hold")
	within(t, sc.hold.entered, "held handler")
	awaitEvent(admission.EventAdmitted)

	waiters := []string{"q0", "q1", "q2"}
	for i, key := range waiters {
		require.Equal(t, i, queued(), "requests queued before %s is sent", key)
		send(key)
		awaitEvent(admission.EventQueued)
	}
	require.Equal(t, 3, queued())

	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "full"})
	require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(err).Reason, "%v", err)

	close(sc.hold.release)
	for range 1 + len(waiters) {
		require.NoError(t, within(t, done, "answer"))
	}

	type seen struct {
		decision, class string
		ahead           int64
	}
	got := map[string]seen{}
	for _, s := range spans.Ended() {
		key, ok := attr(s.Attributes(), "key")
		if !ok {
			continue
		}
		for _, e := range s.Events() {
			if e.Name != "tollgate.admission" {
				continue
			}
			d, _ := attr(e.Attributes, "decision")
			c, _ := attr(e.Attributes, "class")
			q, ok := attr(e.Attributes, "queued_ahead")
			require.True(t, ok, "%s: queued_ahead is set", key.AsString())
			_, dup := got[key.AsString()]
			require.False(t, dup, "%s: one admission event", key.AsString())
			got[key.AsString()] = seen{d.AsString(), c.AsString(), q.AsInt64()}
		}
	}
	require.Equal(t, map[string]seen{
		"hold": {"admitted", "work", 0},
		"q0":   {"admitted", "work", 0},
		"q1":   {"admitted", "work", 1},
		"q2":   {"admitted", "work", 2},
		"full": {"refused:QUEUE_FULL", "work", 3},
	}, got)
}

// A review found that a request that waited in admission's queue and whose
// client went away before it started got a tollgate.admission event saying
// "refused:UNSPECIFIED": nothing refused it, and admission counts it as
// cancelled (tollgate.admission.decisions{decision=cancelled}). The event
// must say so too: decision "cancelled", with the class and the requests
// that were queued ahead of it. A later review found that the event said
// "cancelled" of any wait ended by a context.Canceled, while admission
// counts one canceled once its deadline had passed (a client's RST_STREAM
// at its deadline can come before the server's own timer) as the
// DEADLINE_EXPIRED refusal it is: the event must say what admission
// counted, "refused:DEADLINE_EXPIRED" for such a request ("late").
func TestAdmissionEventOfACancelledWaiter(t *testing.T) {
	ended := make(chan struct{}, 4)
	sc := newEventScene(t, func() { ended <- struct{}{} })
	ctrl, client, spans, awaitEvent := sc.ctrl, sc.client, sc.spans, sc.awaitEvent

	held := make(chan error, 1)
	go func() {
		_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "hold"})
		held <- err
	}()
	within(t, sc.hold.entered, "held handler")
	awaitEvent(admission.EventAdmitted)

	for _, key := range []string{"gone", "late"} {
		ctx, cancel := context.WithCancel(t.Context())
		gone := make(chan error, 1)
		go func() {
			_, err := client.Get(ctx, &testingv1.GetRequest{Key: key})
			gone <- err
		}()
		awaitEvent(admission.EventQueued)
		cancel()
		within(t, gone, "the canceled call's answer")
		awaitEvent(admission.EventDropped)
		within(t, ended, "the canceled request's span") // the held request's has not ended
	}
	close(sc.hold.release)
	require.NoError(t, within(t, held, "answer"))
	within(t, ended, "the held request's span")

	var decisions []string
	for _, s := range spans.Ended() {
		key, _ := attr(s.Attributes(), "key")
		if key.AsString() == "hold" {
			continue
		}
		for _, e := range s.Events() {
			if e.Name == "tollgate.admission" {
				d, _ := attr(e.Attributes, "decision")
				c, _ := attr(e.Attributes, "class")
				q, _ := attr(e.Attributes, "queued_ahead")
				decisions = append(decisions, key.AsString()+": "+d.AsString()+" "+c.AsString()+" "+strconv.FormatInt(q.AsInt64(), 10))
			}
		}
	}
	require.Equal(t, []string{"gone: cancelled work 0", "late: refused:DEADLINE_EXPIRED work 0"}, decisions,
		"the client went away: nothing refused its request; unless its deadline had passed")
	st, _ := ctrl.Stats().Class("work")
	require.EqualValues(t, 1, st.Cancelled)
	require.Equal(t, map[string]uint64{"DEADLINE_EXPIRED": 1}, st.Refused)
}

// endsPastDeadline is a request context that, once canceled, reports a
// deadline that has passed: one whose client's RST_STREAM, sent at the
// client's deadline, came before the server's timer for it fired.
type endsPastDeadline struct{ context.Context }

func (c endsPastDeadline) Deadline() (time.Time, bool) {
	if c.Err() != nil {
		return time.Now().Add(-time.Millisecond), true
	}
	return c.Context.Deadline()
}

package admission_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// TestBurstSeed004 is seed 004's burst test over real gRPC: a pool of two
// workers; two long tasks of tenant A; a burst of short tasks from A and B;
// A reaches its queue budget without blocking B; a task whose deadline is
// shorter than the predicted wait is refused with a stable reason and retry
// guidance; after the queue drains admission recovers without a restart.
func TestBurstSeed004(t *testing.T) {
	obs, evs := events()
	ctrl, err := admission.New(obs,
		admission.WithClasses(admission.Class{
			Name: "agent", Slots: 2, QueueItems: 16,
			ExpectedServiceTime: time.Second, // seeds the estimates: long tasks
			TenantQueueWork:     3 * time.Second,
		}),
		admission.WithStages(admission.AllStages&^admission.StageDegradation))
	require.NoError(t, err)
	defer ctrl.Close()
	srv := startServer(t, ctrl, false)
	ctx := context.Background()
	heavy := "/demo.Jobs/Heavy"

	// Two long tasks of A take both workers.
	var longs []*call
	for i := range 2 {
		longs = append(longs, srv.start(ctx, heavy, fmt.Sprint("long", i), "A"))
		require.Equal(t, admission.EventAdmitted, next(evs, decided...).Kind)
	}
	// Burst: A's waiting work reaches its 3s budget after three tasks; B is
	// not blocked by A.
	var queued []*call
	refusedA := 0
	for i := range 5 {
		c := srv.start(ctx, heavy, fmt.Sprint("a", i), "A")
		switch e := next(evs, decided...); e.Kind {
		case admission.EventQueued:
			queued = append(queued, c)
		case admission.EventRefused:
			require.Equal(t, status.ReasonTenantLimit, e.Reason)
			err := <-c.done
			require.Equal(t, status.ReasonTenantLimit, status.OutcomeOf(err).Reason)
			refusedA++
		}
	}
	require.Len(t, queued, 3)
	require.Equal(t, 2, refusedA)
	for i := range 3 {
		queued = append(queued, srv.start(ctx, heavy, fmt.Sprint("b", i), "B"))
		require.Equal(t, admission.EventQueued, next(evs, decided...).Kind, "B is not blocked by A's budget")
	}
	st, _ := ctrl.Stats().Class("agent")
	require.Equal(t, 3, st.Tenants["A"].Queued)
	require.Equal(t, 3, st.Tenants["B"].Queued)
	// Predicted wait: 6 queued seconds + 2 running seconds over 2 workers.
	require.InDelta(t, 4*time.Second, st.PredictedWait, float64(100*time.Millisecond))

	// A task (of a third tenant, under its budget) due in 2s cannot start
	// within the ~4s predicted wait: refused, with the same stable reason
	// every time, and retry guidance.
	for range 2 {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c := srv.start(dctx, heavy, "", "C")
		require.Equal(t, admission.EventRefused, next(evs, decided...).Kind)
		err := <-c.done
		cancel()
		gs, _ := grpcstatus.FromError(err)
		require.Equal(t, codes.ResourceExhausted, gs.Code())
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind)
		require.Equal(t, status.ReasonDeadlineUnreachable, o.Reason)
		var info *errdetails.ErrorInfo
		for _, d := range gs.Details() {
			if ei, ok := d.(*errdetails.ErrorInfo); ok {
				info = ei
			}
		}
		require.NotNil(t, info)
		require.Equal(t, "DEADLINE_UNREACHABLE", info.GetReason())
		require.Equal(t, status.Domain, info.GetDomain())
		ra, ok := status.RetryAfter(err)
		require.True(t, ok)
		require.Greater(t, ra, time.Second)
	}

	// Drain: the long tasks end, the queue runs through.
	srv.gates.open("long0")
	srv.gates.open("long1")
	for _, c := range longs {
		require.NoError(t, <-c.done)
	}
	for i := range 3 {
		srv.gates.open(fmt.Sprint("a", i))
		srv.gates.open(fmt.Sprint("b", i))
	}
	for _, c := range queued {
		require.NoError(t, <-c.done)
	}
	st, _ = ctrl.Stats().Class("agent")
	require.Zero(t, st.Queued)
	require.Zero(t, st.Running)

	// Recovered without a restart: a deadline task and a burst are admitted.
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	require.NoError(t, srv.conn.Invoke(dctx, heavy, wrapValue(""), wrapValue("")))
	for i := range 2 {
		c := srv.start(ctx, heavy, fmt.Sprint("again", i), "A")
		require.Equal(t, admission.EventAdmitted, next(evs, decided...).Kind)
		srv.gates.open(fmt.Sprint("again", i))
		require.NoError(t, <-c.done)
	}
}

// TestControlPathStaysOpen saturates every other class and checks that the
// control class (health here) still answers (§3.12).
func TestControlPathStaysOpen(t *testing.T) {
	obs, evs := events()
	ctrl, err := admission.New(obs,
		admission.WithClasses(
			admission.Class{Name: "heavy", Slots: 2, QueueItems: 2},
			admission.Class{Name: "light", Slots: 1},
		),
		admission.WithMethods("light", "/demo.Jobs/Light"))
	require.NoError(t, err)
	defer ctrl.Close()
	srv := startServer(t, ctrl, false)
	ctx := context.Background()
	var held []*call
	for i := range 4 {
		held = append(held, srv.start(ctx, "/demo.Jobs/Heavy", fmt.Sprint("h", i), ""))
		next(evs, decided...)
	}
	held = append(held, srv.start(ctx, "/demo.Jobs/Light", "l", ""))
	next(evs, decided...)
	var trailer metadata.MD
	err = srv.conn.Invoke(ctx, "/demo.Jobs/Heavy", wrapValue("x"), wrapValue(""), grpc.Trailer(&trailer))
	require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(err).Reason)
	require.NotEmpty(t, trailer.Get(status.PushbackKey), "the refusal carries the pushback trailer")
	err = srv.conn.Invoke(ctx, "/demo.Jobs/Light", wrapValue("x"), wrapValue(""))
	require.Equal(t, status.ReasonConcurrencyFull, status.OutcomeOf(err).Reason)

	for range 5 {
		resp, err := healthClient(srv.conn).Check(ctx, healthReq())
		require.NoError(t, err)
		require.Equal(t, "SERVING", resp.GetStatus().String())
	}
	st, _ := ctrl.Stats().Class(admission.ControlClass)
	require.EqualValues(t, 5, st.Admitted)
	for i := range 4 {
		srv.gates.open(fmt.Sprint("h", i))
	}
	srv.gates.open("l")
	for _, c := range held {
		require.NoError(t, <-c.done)
	}
}

// TestTapRefusesEarly checks the tap: it refuses with a typed NOT_ADMITTED
// status when the class is full, before the interceptor runs, and lets
// everything through otherwise.
func TestTapRefusesEarly(t *testing.T) {
	obs, evs := events()
	ctrl, err := admission.New(obs, admission.WithClasses(admission.Class{Name: "heavy", Slots: 1, QueueItems: 1}))
	require.NoError(t, err)
	defer ctrl.Close()
	srv := startServer(t, ctrl, true)
	ctx := context.Background()
	a := srv.start(ctx, "/demo.Jobs/Heavy", "a", "")
	next(evs, decided...)
	b := srv.start(ctx, "/demo.Jobs/Heavy", "b", "")
	require.Equal(t, admission.EventQueued, next(evs, decided...).Kind)
	seen := interceptorCalls(srv)
	err = srv.conn.Invoke(ctx, "/demo.Jobs/Heavy", wrapValue("c"), wrapValue(""))
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonQueueFull, o.Reason)
	require.Equal(t, "heavy", o.Detail.GetWorkloadClass())
	ra, ok := status.RetryAfter(err)
	require.True(t, ok)
	require.Positive(t, ra)
	require.Equal(t, seen, interceptorCalls(srv), "the tap refused before the interceptor")
	// Health is another class: the tap lets it through.
	_, err = healthClient(srv.conn).Check(ctx, healthReq())
	require.NoError(t, err)
	srv.gates.open("a")
	srv.gates.open("b")
	require.NoError(t, <-a.done)
	require.NoError(t, <-b.done)
	// Open again.
	require.NoError(t, srv.conn.Invoke(ctx, "/demo.Jobs/Heavy", wrapValue(""), wrapValue("")))
}

func interceptorCalls(s *server) int64 {
	v, ok := s.calls.Load("/demo.Jobs/Heavy")
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

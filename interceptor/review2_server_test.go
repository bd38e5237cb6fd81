package interceptor_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// A review found that a try whose attempt's deadline lies beyond the
// server's WithMaxAttemptTime, and so was capped to it on arrival, and that
// admission dropped from its queue because it could no longer finish by
// that cap, was refused DEADLINE_EXPIRED final: tryDeadlineOnly compared
// the deadline admission judged by with the capped one, found them equal,
// and kept admission's "no repeat can help". But the cap is counted from
// each request's arrival (WithMaxAttemptTime), so a repeat gets a fresh one,
// and the caller's own attempt deadline (here 10 s away) has not passed: a
// final refusal for a call that a repeat could still complete (DESIGN.md §1
// "final"). The refusal is repeatable, with a delay that reflects the queue,
// whether the call keeps a record (its handler would run detached until the
// capped deadline) or not, and whether the admission tap, which bounds the
// stream's context by the cap as it read it a moment earlier, is installed.
func TestCappedAttemptDeadlineDropIsNotFinal(t *testing.T) {
	for _, c := range []struct{ recorded, tap bool }{{false, true}, {false, false}, {true, true}, {true, false}} {
		recorded := c.recorded
		t.Run(fmt.Sprintf("recorded=%v,tap=%v", c.recorded, c.tap), func(t *testing.T) {
			ctrl := workCtrl(t, admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond})
			opts := []interceptor.ServerOption{interceptor.WithAdmission(ctrl), interceptor.WithMaxAttemptTime(500 * time.Millisecond)}
			if !c.tap {
				// The tap bounds the stream's context by the cap as read a
				// moment earlier, which by luck hides the fault.
				opts = append(opts, interceptor.WithoutAdmissionTap())
			}
			if recorded {
				opts = append(opts, interceptor.WithAttemptStore(noSkewStore(t)))
			}
			h := newSlotHolder()
			svc := &testsvc.Service{ApplyFunc: h.apply}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(opts...)...)
			client := testingv1.NewTestServiceClient(end.DialT(t))
			holdSlot(t, h, client)

			d := time.Now().Add(10 * time.Second).UnixMilli() // the caller's attempt: far beyond the server's cap
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			_, err := client.Apply(asFirstTry(ctx, d), &testingv1.ApplyRequest{Key: "b"})
			o := status.OutcomeOf(err)
			ra, ok := status.RetryAfter(err)
			t.Logf("%v final=%v retry-after %v: %v", o.Reason, o.Final(), ra, err)
			require.Equal(t, status.KindNotAdmitted, o.Kind)
			require.Equal(t, status.ReasonDeadlineExpired, o.Reason)
			require.False(t, o.Final(), "the server's cap, not the caller's deadline, was lost: a repeat gets a fresh cap")
			require.True(t, ok && ra > 0, "a repeatable refusal suggests a delay")
		})
	}
}

// The same, end to end, for a recorded call: a tollgate client whose attempt has 10 s meets a
// server that caps attempts at 500 ms from arrival, and whose only slot is
// held for a while. The first try is dropped when it can no longer finish
// by its cap; told that no repeat could help, the call ended there. A
// repeat, under a fresh cap, starts once the slot frees, and succeeds.
func TestCappedAttemptDeadlineDropIsRepeated(t *testing.T) {
	ctrl := workCtrl(t, admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond})
	h := newSlotHolder()
	var tries atomic.Int32
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if r.GetKey() != "hold" {
			tries.Add(1)
		}
		return h.apply(ctx, r)
	}}
	store := noSkewStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(store),
		interceptor.WithMaxAttemptTime(500*time.Millisecond))...)
	h.holdApply(context.Background(), testingv1.NewTestServiceClient(end.DialT(t)))
	freed := make(chan error, 1)
	timer := time.AfterFunc(900*time.Millisecond, func() { freed <- h.free() })
	defer func() {
		if timer.Stop() {
			freed <- h.free()
		}
		<-freed
	}()

	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(10*time.Second), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 5}))...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "b"})
	t.Logf("%v", err)
	require.NoError(t, err, "a repeat under a fresh cap could run: %v", status.OutcomeOf(err))
	require.EqualValues(t, 1, tries.Load())
}

package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/metadata"
)

// TestDeadlineRefusalFinality drives the server-side paths that refuse a try
// NOT_ADMITTED DEADLINE_EXPIRED or DEADLINE_UNREACHABLE through a real
// bufconn server and a raw gRPC client, and checks each refusal's final flag
// against DESIGN.md §1: final exactly when no repeat within the attempt can
// succeed — the attempt's deadline (the caller's d, or the request's own
// deadline for an attempt minted here; plus the skew) has passed or cannot
// be met, not merely the try's own grpc-timeout or the server's cap
// (WithMaxAttemptTime, counted afresh from each request's arrival). A final
// refusal suggests no delay; a repeatable one suggests one that reflects the
// class's queue.
//
// Rows with dedicated tests elsewhere are not repeated here:
//   - the admission tap never refuses for a deadline (admission.tapReasons);
//   - a try capped by the server's maximum and dropped from the queue:
//     TestCappedAttemptDeadlineDropIsNotFinal (review2_server_test.go);
//   - a try whose context ended before Begin (deadline, deadline with the
//     attempt's passed, cancel; unary and streams):
//     TestEndedContextBeforeBeginIsNotStoreUnavailable (round3_server_test.go);
//   - a try deadline within the skew after the caller's d:
//     TestTryDeadlineWithinSkewOfAttemptIsNotFinal (round3_server_test.go);
//   - a stream's request after the server's cap, and the store's late
//     refusal of it: TestStreamRequestAfterCapIsNotFinal (review4_test.go);
//   - a context canceled after the cap passed: TestCanceledAfterCapIsNotFinal
//     (review4_test.go);
//   - admission's own stages (arrival, queue, dequeue, context ended) on
//     the request's deadline: admission/deadline_final_test.go (a
//     detached try whose per-try context ends in the queue is refused not
//     final there: its request's deadline, d plus the skew, has not passed;
//     over gRPC its client's own deadline races the refusal).
func TestDeadlineRefusalFinality(t *testing.T) {
	const far = 10 * time.Second
	for _, c := range []struct {
		name       string
		header     bool          // a trusted caller's header, with d = now + d
		noD        bool          // the header carries no d (it is optional on the wire)
		d          time.Duration // the caller's d, from now
		timeout    time.Duration // the try's own deadline (grpc-timeout), from now
		maxAttempt time.Duration // WithMaxAttemptTime (0: the default)
		skew       time.Duration // WithClockSkew
		recorded   bool          // a record store
		hold       bool          // the class's one slot is held throughout
		expected   time.Duration // the class's ExpectedServiceTime
		wantReason status.Reason
		wantFinal  bool
	}{
		{name: "arrival: caller's d passed", header: true, d: -time.Second, timeout: 5 * time.Second,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: true},
		{name: "store late refusal: caller's d passed", header: true, d: -time.Second, timeout: 5 * time.Second, recorded: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: true},
		{name: "dequeue: per-try timeout before d", header: true, d: far, timeout: 300 * time.Millisecond, hold: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: false},
		{name: "dequeue: caller's d", header: true, d: 300 * time.Millisecond, timeout: 5 * time.Second, hold: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: true},
		{name: "dequeue: caller's d plus the skew", header: true, d: 300 * time.Millisecond, timeout: 5 * time.Second,
			skew: 300 * time.Millisecond, hold: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: true},
		{name: "dequeue, detached: caller's d", header: true, d: 300 * time.Millisecond, timeout: 5 * time.Second,
			recorded: true, hold: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: true},
		{name: "dequeue, minted: request's deadline", d: 0, timeout: 300 * time.Millisecond, hold: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: true},
		{name: "dequeue, minted: server's cap before the request's deadline", timeout: 5 * time.Second,
			maxAttempt: 300 * time.Millisecond, hold: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: false},
		{name: "dequeue, minted: server's cap plus the skew before the request's deadline", timeout: 5 * time.Second,
			maxAttempt: 300 * time.Millisecond, skew: 200 * time.Millisecond, hold: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: false},
		{name: "dequeue, header without d: server's cap before the request's deadline", header: true, noD: true,
			timeout: 5 * time.Second, maxAttempt: 300 * time.Millisecond, hold: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: false},
		{name: "dequeue, header without d: request's deadline", header: true, noD: true, timeout: 300 * time.Millisecond, hold: true,
			expected: 100 * time.Millisecond, wantReason: status.ReasonDeadlineExpired, wantFinal: true},
		{name: "arrival: predicted service time past d", header: true, d: 300 * time.Millisecond, timeout: 5 * time.Second,
			expected: time.Second, wantReason: status.ReasonDeadlineUnreachable, wantFinal: false},
		{name: "arrival, detached: predicted wait past the per-try timeout", header: true, d: far, timeout: 300 * time.Millisecond,
			recorded: true, hold: true,
			expected: time.Second, wantReason: status.ReasonDeadlineUnreachable, wantFinal: false},
	} {
		for _, tap := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s,tap=%v", c.name, tap), func(t *testing.T) {
				ctrl := workCtrl(t, admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: c.expected})
				opts := []interceptor.ServerOption{interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(c.skew)}
				if !tap {
					opts = append(opts, interceptor.WithoutAdmissionTap())
				}
				if c.maxAttempt > 0 {
					opts = append(opts, interceptor.WithMaxAttemptTime(c.maxAttempt))
				}
				if c.recorded {
					opts = append(opts, interceptor.WithAttemptStore(noSkewStore(t)))
				}
				h := newSlotHolder()
				svc := &testsvc.Service{ApplyFunc: h.apply}
				end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(opts...)...)
				client := testingv1.NewTestServiceClient(end.DialT(t))
				if c.hold {
					holdSlot(t, h, client)
				}

				now := time.Now()
				ctx, cancel := context.WithDeadline(t.Context(), now.Add(c.timeout))
				defer cancel()
				id, _ := uuid.NewV7()
				switch {
				case c.header && c.noD:
					ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", fmt.Sprintf("a=%s;c=0;t=1", id))
				case c.header:
					ctx = metadata.AppendToOutgoingContext(ctx, "tollgate",
						fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, now.Add(c.d).UnixMilli()))
				}
				_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "b"})
				o := status.OutcomeOf(err)
				ra, hasRA := status.RetryAfter(err)
				t.Logf("%v final=%v retry-after %v: %v", status.ReasonName(o.Reason), o.Final(), ra, err)
				require.Equal(t, status.KindNotAdmitted, o.Kind)
				require.Equal(t, c.wantReason, o.Reason)
				require.Equal(t, c.wantFinal, o.Final())
				if c.wantFinal {
					require.False(t, hasRA && ra > 0, "a final refusal suggests no delay")
				} else {
					require.True(t, hasRA && ra > 0, "a repeatable refusal suggests a delay that reflects the queue")
				}
				if c.header {
					require.Equal(t, id.String(), o.Detail.GetAttemptId(), "the refusal names the try it answers")
				}
			})
		}
	}
}

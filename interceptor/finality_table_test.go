package interceptor_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
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

// The store's DEADLINE_UNREACHABLE (a store that waits for replicas sends
// nothing for a try whose context has too little time left) is final only
// when no repeat could have the time: the attempt's time left with the skew
// falls short of what the store needs. When the attempt's deadline is the
// server's cap (WithMaxAttemptTime, counted from this request's arrival), a
// repeat arrives under a fresh one: here a server-streaming try whose
// request came late in its 1 s cap, with the caller's d 10 s away, is not
// final. (The rows where the caller's d or the try's own timeout is short:
// TestStoreWithTooLittleTimeRefusesDeadlineUnreachable, server_test.go.)
func TestStoreTooLittleTimeUnderCapIsNotFinal(t *testing.T) {
	c, prefix := killRedis(t)
	ctx := context.Background()
	cfg, err := c.ConfigGet(ctx, "hz").Result()
	require.NoError(t, err)
	hz, err := strconv.Atoi(cfg["hz"])
	require.NoError(t, err)
	tick := time.Second / time.Duration(hz)
	require.GreaterOrEqual(t, tick, 50*time.Millisecond, "the test needs Redis's default hz (10), not %d", hz)
	store, err := redisstore.New(ctx, c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(killPolicy(0)),
		redisstore.WithReplicas(1, 50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() }) // after the server's stop (cleanups run last first)
	const maxAttempt = time.Second
	ctrl := workCtrl(t, admission.Class{Name: "work", Slots: 4, ExpectedServiceTime: 10 * time.Millisecond})
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{}).Register,
		serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(store), interceptor.WithMaxAttemptTime(maxAttempt))...)
	conn := end.DialT(t)
	sctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	id, _ := uuid.NewV7()
	sctx = metadata.AppendToOutgoingContext(sctx, "tollgate",
		fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, time.Now().Add(10*time.Second).UnixMilli()))
	start := time.Now()
	s, err := conn.NewStream(sctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
	require.NoError(t, err)
	// The request comes before the cap, with less than the store's two
	// ticks of it left.
	time.Sleep(time.Until(start.Add(maxAttempt - tick)))
	require.NoError(t, s.SendMsg(&testingv1.ConsumeRequest{}))
	require.NoError(t, s.CloseSend())
	err = s.RecvMsg(&testingv1.ConsumeResponse{})
	o := status.OutcomeOf(err)
	t.Logf("%v final=%v: %v", status.ReasonName(o.Reason), o.Final(), err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonDeadlineUnreachable, o.Reason)
	require.ErrorContains(t, err, "too little time", "the store's refusal")
	require.False(t, o.Final(), "only the server's cap, counted from this try's arrival, is short: a repeat gets a new one")
}

// A refusal from below that a handler passes up (a method without side
// effects keeps it NOT_ADMITTED) was judged final against the attempt's
// deadline this server sent down: when that is the server's cap
// (WithMaxAttemptTime, from this request's arrival), the handler's own
// call is refused DEADLINE_UNREACHABLE final by its client (the cap less
// the hop margin leaves no time), and the caller, whose d is 10 s away, was
// told no repeat could help; a repeat gets a fresh cap.
func TestRefusalFromBelowUnderCapIsNotFinal(t *testing.T) {
	dep := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{}).Register, serverOpts()...)
	depConn := dep.DialT(t, interceptor.DialOptions(interceptor.WithHopMargin(250*time.Millisecond))...)
	depClient := testingv1.NewTestServiceClient(depConn)
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		time.Sleep(100 * time.Millisecond) // the cap less the hop margin passes
		return depClient.Get(ctx, r)
	}}
	front := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithMaxAttemptTime(300*time.Millisecond))...)
	client := testingv1.NewTestServiceClient(front.DialT(t))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	id, _ := uuid.NewV7()
	ctx = metadata.AppendToOutgoingContext(ctx, "tollgate",
		fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, time.Now().Add(10*time.Second).UnixMilli()))
	_, err := client.Get(ctx, &testingv1.GetRequest{Key: "k"})
	o := status.OutcomeOf(err)
	t.Logf("%v final=%v: %v", status.ReasonName(o.Reason), o.Final(), err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonDeadlineUnreachable, o.Reason)
	require.False(t, o.Final(), "only the server's cap, counted from this try's arrival, left no time: a repeat gets a new one")
}

package interceptor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// r15TokenProbe is a Get handler that sheds each key's first try: a call of
// a fresh key succeeds only when the client's retry budget has a token for
// its repeat.
type r15TokenProbe struct {
	mu   sync.Mutex
	runs map[string]int
}

func (p *r15TokenProbe) get(_ context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
	p.mu.Lock()
	if p.runs == nil {
		p.runs = map[string]int{}
	}
	p.runs[r.GetKey()]++
	first := p.runs[r.GetKey()] == 1
	p.mu.Unlock()
	if first {
		return nil, shed()
	}
	return &testingv1.GetResponse{Value: "ok"}, nil
}

// r15RequireTokensLeft requires that client's retry budget holds exactly
// left tokens (0, 1 or 2), probing it with calls whose first try is shed.
func r15RequireTokensLeft(t *testing.T, client testingv1.TestServiceClient, left int, why string) {
	t.Helper()
	for i := 0; i < left; i++ {
		_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "probe-ok-" + string(rune('a'+i))})
		require.NoError(t, err, "%s: expected %d tokens left, found %d (%v)", why, left, i, status.OutcomeOf(err))
	}
	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "probe-none"})
	require.Equal(t, status.ReasonRetryBudgetExhausted, status.OutcomeOf(err).Reason,
		"%s: expected %d tokens left, found more (%v)", why, left, err)
}

// A stream's first verifying try withdraws no retry-budget token (the
// resolution's covers it). When it never leaves the client (an inner
// interceptor refuses it: NOT_SENT), none may go back either, and the
// repeats that follow, never sent, give back the tokens they took: the
// call costs the budget the resolution's one token, as a unary call's does.
func TestR15StreamVerifyingTryNotSentGivesBackNoToken(t *testing.T) {
	for _, kind := range []string{"unary", "stream"} {
		t.Run(kind, func(t *testing.T) {
			probe := &r15TokenProbe{}
			var chats atomic.Int32
			var applies atomic.Int32
			svc := &testsvc.Service{GetFunc: probe.get,
				ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
					return drainChat(st)
				},
				ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
					return &testingv1.ApplyResponse{}, nil
				}}
			loseFirstApply := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				if info.FullMethod != testingv1.TestService_Apply_FullMethodName || applies.Add(1) != 1 {
					return h(ctx, req)
				}
				_, _ = h(ctx, req)
				return nil, grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
			})
			end := recordedServer(t, svc, memoryStore(t), loseFirstApply, loseFirstChatAnswer(&chats))
			// Inner interceptors: every try after the first of the keyed
			// call never leaves the client.
			var opened atomic.Int32
			innerStream := grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				if method == testingv1.TestService_Chat_FullMethodName && opened.Add(1) > 1 {
					return nil, grpcstatus.Error(codes.Unavailable, "inner: no connection")
				}
				return streamer(ctx, desc, cc, method, opts...)
			})
			innerUnary := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if method == testingv1.TestService_Apply_FullMethodName && opened.Add(1) > 1 {
					return grpcstatus.Error(codes.Unavailable, "inner: no connection")
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})
			opts := append(interceptor.DialOptions(fastRetry(3),
				interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(2))),
				innerStream, innerUnary)
			client := testingv1.NewTestServiceClient(end.DialT(t, opts...))
			ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)
			ctx = interceptor.WithCallKey(ctx, "pay")
			if kind == "stream" {
				err = chatOnce(t, ctx, client)
			} else {
				_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
			}
			t.Logf("opened %d, err %v", opened.Load(), err)
			require.Greater(t, opened.Load(), int32(1), "precondition: the verifying try was attempted")
			require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
			r15RequireTokensLeft(t, client, 1, "the resolution's token is spent, and no other")
		})
	}
}

// A review (r15) found that a repeat of a verifying try is not asked
// whether it may be sent, as the verifying try itself is
// (TestMarkBeforeVerifyingTryIsHeeded) and as every repeat after a fence is
// (TestMarkBeforeLaterRepeatAfterFenceIsHeeded). A resolution found try 1's
// record SUCCEEDED under the call's explicit key; the verifying try, try 2,
// is refused without effect (QUEUE_FULL), and before try 3 is sent another
// call's query marks the target recordless. Try 3 is a verifying try in all
// but name: at the store backend the record answers it, but at a store-less
// backend it runs the handler of a method with side effects a second time.
// It must not be sent: the call ends UNKNOWN with the handler run once.
func TestR15MarkBeforeRepeatOfVerifyingTryIsHeeded(t *testing.T) {
	const (
		precondition = "try 1 was resolved SUCCEEDED, and the warm-up call marked the target"
		why          = "the target was marked recordless before try 3 was sent: the handler must not run again"
	)
	t.Run("unary", func(t *testing.T) {
		var effects, kTries atomic.Int64
		m := &lateMark{}
		// The store backend answers query 1 SUCCEEDED, and arms nothing.
		end := m.server(t, lateMarkService(&effects), false, func(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
			switch kTries.Add(1) {
			case 1: // the store backend runs and records it; the answer is lost
				_, _ = handler(ctx, req)
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			case 2: // the verifying try, refused without effect; the mark comes before try 3
				m.armed.Store(true)
				return nil, queueFull()
			default: // the store-less backend runs it
				effects.Add(1)
				return &testingv1.ApplyResponse{}, nil
			}
		}, nil)
		cli := m.dial(t, end)
		_, err := cli.Apply(interceptor.WithCallKey(t.Context(), "pay"), &testingv1.ApplyRequest{Key: "k"})
		m.requireHeeded(t, err, &kTries, &effects, precondition, why)
		require.Equal(t, int64(2), kTries.Load(), "try 3 is not sent")
	})
	t.Run("stream", func(t *testing.T) {
		var effects, tries atomic.Int64
		m := &lateMark{}
		end := m.server(t, lateMarkService(&effects), false, nil, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			switch tries.Add(1) {
			case 1: // the store backend runs and records it; the answer is lost
				_ = h(srv, ss)
				return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
			case 2: // the verifying try, refused without effect
				m.armed.Store(true)
				return queueFull()
			default: // the store-less backend runs it
				effects.Add(1)
				return nil
			}
		})
		cli := m.dial(t, end)
		err := chatOnce(t, interceptor.WithCallKey(t.Context(), "chat"), cli)
		m.requireHeeded(t, err, &tries, &effects, precondition, why)
		require.Equal(t, int64(2), tries.Load(), "try 3 is not sent")
	})
}

// r15BudgetedLateMark dials end as lateMark.dial does, but with a retry
// budget of max tokens that never refills, and a Get handler (probe) that
// sheds each key's first try.
func r15BudgetedLateMark(t *testing.T, m *lateMark, end *testsvc.Endpoint, max int) testingv1.TestServiceClient {
	t.Helper()
	m.cli = testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3), interceptor.WithClientClock(m.clock(t)),
		interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(float64(max))))...))
	return m.cli
}

// The stream's check moved from afterTryLocked to just before the try is
// sent (tryFromLocked): a repeat after a fence it stops gives back the token
// proceed withdrew for it, once; a verifying try it stops gives back none
// (it withdrew none). Each call costs the budget its resolutions' tokens:
// the stream's one and the warm-up call's one.
func TestR15StreamRepeatStoppedBeforeSendingKeepsTokensExact(t *testing.T) {
	for _, verify := range []bool{false, true} {
		name := "after-fence"
		if verify {
			name = "verifying"
		}
		t.Run(name, func(t *testing.T) {
			var effects, tries atomic.Int64
			m := &lateMark{}
			probe := &r15TokenProbe{}
			svc := lateMarkService(&effects)
			svc.GetFunc = probe.get
			end := m.server(t, svc, true, nil, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if tries.Add(1) == 1 {
					if verify {
						_ = h(srv, ss) // the store backend runs and records it
					} else {
						effects.Add(1) // the store-less backend runs it
					}
					return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
				}
				effects.Add(1)
				return nil
			})
			cli := r15BudgetedLateMark(t, m, end, 4)
			ctx := t.Context()
			if verify {
				ctx = interceptor.WithCallKey(ctx, "chat")
			}
			err := chatOnce(t, ctx, cli)
			m.requireHeeded(t, err, &tries, &effects, "the warm-up call marked the target", "the handler ran once")
			require.Equal(t, int64(1), tries.Load(), "no repeat was sent")
			r15RequireTokensLeft(t, cli, 2, "two resolutions' tokens are spent, and no other")
		})
	}
}

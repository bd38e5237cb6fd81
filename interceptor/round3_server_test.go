package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// noSkewStore is a memory store with no clock skew.
func noSkewStore(t *testing.T) idempotency.Store {
	t.Helper()
	pol := idempotency.DefaultPolicy()
	pol.Skew = 0
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(pol))
	require.NoError(t, err)
	return store
}

// holdSlot has h hold the server's one slot through client (an Apply with
// key "hold") until the test ends.
func holdSlot(t *testing.T, h *slotHolder, client testingv1.TestServiceClient) {
	h.holdApply(context.Background(), client)
	t.Cleanup(func() { _ = h.free() })
}

// asFirstTry makes ctx's call try 1 of call 0 of a new attempt whose
// deadline is d (Unix ms), as a tollgate client would send it.
func asFirstTry(ctx context.Context, d int64) context.Context {
	id, _ := uuid.NewV7()
	return metadata.AppendToOutgoingContext(ctx, "tollgate", fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, d))
}

// endedCtx returns ctx ended as the test case says: "deadline" (a deadline
// already passed, as a user's timeout interceptor chained outside
// tollgate's, or a client's grpc-timeout that ran out while the request was
// decoded, leaves it) or "cancel".
func endedCtx(ctx context.Context, how string) (context.Context, context.CancelFunc) {
	if how == "deadline" {
		return context.WithDeadline(ctx, time.Now().Add(-time.Millisecond))
	}
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	return ctx, cancel
}

type endedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *endedStream) Context() context.Context { return s.ctx }

// A review found that, without admission, a recorded try whose context had
// already ended when tollgate's interceptor began its record (a user's
// timeout interceptor chained outside tollgate's cut it, or the client's
// deadline passed while its request was decoded) reached the store, whose
// Begin failed with the context's error, and was refused NOT_ADMITTED
// STORE_UNAVAILABLE (code UNAVAILABLE, repeatable): a store that is fine
// was reported down, and a caller whose attempt's deadline had passed was
// told to repeat. The refusal names the cause: DEADLINE_EXPIRED — not
// final while the attempt's deadline has not passed (only the try's own
// ended), final once it has — or, for a context canceled before any
// deadline, a NOT_ADMITTED that names no reason (as admission's refusal of
// a cancelled waiter), never STORE_UNAVAILABLE. The same holds on the
// stream path (a client-streaming and a server-streaming call).
func TestEndedContextBeforeBeginIsNotStoreUnavailable(t *testing.T) {
	for _, c := range []struct {
		how       string
		late      bool // the attempt's deadline has passed too
		wantFinal bool
		wantWhy   status.Reason
	}{
		{"deadline", false, false, status.ReasonDeadlineExpired},
		{"deadline", true, true, status.ReasonDeadlineExpired},
		{"cancel", false, false, status.ReasonUnspecified},
	} {
		for _, kind := range []string{"unary", "client-stream", "server-stream"} {
			t.Run(fmt.Sprintf("%s,late=%v,%s", c.how, c.late, kind), func(t *testing.T) {
				outerUnary := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
					ctx, cancel := endedCtx(ctx, c.how)
					defer cancel()
					return h(ctx, req)
				})
				outerStream := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
					ctx, cancel := endedCtx(ss.Context(), c.how)
					defer cancel()
					return h(srv, &endedStream{ServerStream: ss, ctx: ctx})
				})
				ran := make(chan struct{}, 3)
				svc := &testsvc.Service{
					ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
						ran <- struct{}{}
						return &testingv1.ApplyResponse{}, nil
					},
					UploadFunc: func(s grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
						ran <- struct{}{}
						return s.SendAndClose(&testingv1.UploadResponse{})
					},
				}
				opts := append([]grpc.ServerOption{outerUnary, outerStream},
					serverOpts(interceptor.WithAttemptStore(noSkewStore(t)))...)
				end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, opts...)
				client := testingv1.NewTestServiceClient(end.DialT(t))

				id, _ := uuid.NewV7()
				d := time.Now().Add(10 * time.Second)
				if c.late {
					d = time.Now().Add(-time.Second)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", fmt.Sprintf("a=%s;c=0;t=2;d=%d", id, d.UnixMilli()))
				var err error
				switch kind {
				case "unary":
					_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
				case "client-stream":
					var s grpc.ClientStreamingClient[testingv1.UploadRequest, testingv1.UploadResponse]
					s, err = client.Upload(ctx)
					require.NoError(t, err)
					_, err = s.CloseAndRecv()
				case "server-stream":
					var s grpc.ServerStreamingClient[testingv1.ConsumeResponse]
					s, err = client.Consume(ctx, &testingv1.ConsumeRequest{})
					require.NoError(t, err)
					_, err = s.Recv()
				}
				o := status.OutcomeOf(err)
				t.Logf("%v final=%v: %v", status.ReasonName(o.Reason), o.Final(), err)
				require.Equal(t, status.KindNotAdmitted, o.Kind, "nothing ran")
				require.NotEqual(t, status.ReasonStoreUnavailable, o.Reason, "the store did not fail: the try's context had ended")
				require.NotEqual(t, codes.Unavailable, grpcstatus.Code(err), "the store did not fail")
				require.Equal(t, c.wantWhy, o.Reason)
				require.Equal(t, c.wantFinal, o.Final())
				require.Equal(t, id.String(), o.Detail.GetAttemptId(), "the refusal names the try it answers")
				require.Equal(t, uint32(2), o.Detail.GetTry())
				require.Empty(t, ran, "no handler ran")
			})
		}
	}
}

// A review found that tryDeadlineOnly told the try's own deadline from the
// attempt's by comparing it with the attempt's deadline d, not d plus the
// clock skew. A try's grpc-timeout is measured by the client's clock, which
// may differ from this server's by up to the skew: a try whose deadline
// reads between d and d + skew here may be a per-try timeout set before d
// by a client whose clock lags, and a try admission dropped for it was
// refused final — the caller stopped although a repeat could still finish.
// The other way (a last try read as an earlier one) only costs a repeat
// that the caller's own deadline, or this server, refuses at once. So only
// a try whose own deadline is at or past d + skew, or one dropped once
// d + skew has passed, is refused final.
func TestTryDeadlineWithinSkewOfAttemptIsNotFinal(t *testing.T) {
	const skew = 500 * time.Millisecond
	ctrl := workCtrl(t, admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond})
	h := newSlotHolder()
	svc := &testsvc.Service{ApplyFunc: h.apply}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(skew))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	holdSlot(t, h, client)

	d := time.Now().Add(400 * time.Millisecond)
	// The try's own deadline, by this server's clock, 200 ms after d: less
	// than the skew.
	ctx, cancel := context.WithDeadline(t.Context(), d.Add(200*time.Millisecond))
	defer cancel()
	_, err := client.Apply(asFirstTry(ctx, d.UnixMilli()), &testingv1.ApplyRequest{Key: "b"})
	o := status.OutcomeOf(err)
	t.Logf("%v final=%v: %v", status.ReasonName(o.Reason), o.Final(), err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason)
	require.False(t, o.Final(), "the try's deadline is within the skew of the attempt's: it may be a per-try timeout")
}

// A review asked whether any early exit of the server interceptor answers
// a tollgate caller with a refusal that its owner reads as one passed up by
// a server that does not speak tollgate (owner.relayed: a refusal naming
// another attempt, without tollgate-spent), turning this server's own
// NOT_ADMITTED into UNKNOWN. Each early exit — admission's refusal in the
// interceptor and in the tap, and the refusal of a try whose context ended
// before its record was begun — is checked for a trusted caller (the
// refusal names its attempt) and an untrusted one (it names an attempt
// minted here, with tollgate-spent 0; or, from the tap, the caller's), on a
// unary call and the three kinds of stream: the tollgate client reads each
// as NOT_ADMITTED.
func TestEarlyExitRefusalsAreNotReadAsRelayed(t *testing.T) {
	for _, trusted := range []bool{true, false} {
		for _, exit := range []string{"admission", "tap", "ended"} {
			for _, kind := range []string{"unary", "client-stream", "server-stream", "bidi"} {
				t.Run(fmt.Sprintf("trusted=%v,%s,%s", trusted, exit, kind), func(t *testing.T) {
					ctrl := workCtrl(t, admission.Class{Name: "work", Slots: 1})
					h := newSlotHolder()
					svc := &testsvc.Service{
						ApplyFunc: h.apply,
						UploadFunc: func(s grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
							return s.SendAndClose(&testingv1.UploadResponse{})
						},
					}
					opts := []interceptor.ServerOption{interceptor.WithAttemptStore(noSkewStore(t)),
						interceptor.WithTrustedPeer(func(context.Context) bool { return trusted })}
					var outer []grpc.ServerOption
					switch exit {
					case "admission":
						opts = append(opts, interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap())
					case "tap":
						opts = append(opts, interceptor.WithAdmission(ctrl))
					case "ended":
						outer = []grpc.ServerOption{
							grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
								ctx, cancel := endedCtx(ctx, "deadline")
								defer cancel()
								return h(ctx, req)
							}),
							grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
								ctx, cancel := endedCtx(ss.Context(), "deadline")
								defer cancel()
								return h(srv, &endedStream{ServerStream: ss, ctx: ctx})
							}),
						}
					}
					end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, append(outer, serverOpts(opts...)...)...)
					if exit != "ended" {
						raw := testingv1.NewTestServiceClient(end.DialT(t))
						holdSlot(t, h, raw)
					}
					client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
						interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}),
						interceptor.WithAttemptTimeout(5*time.Second))...))
					ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
					defer cancel()
					var err error
					switch kind {
					case "unary":
						_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
					case "client-stream":
						var s grpc.ClientStreamingClient[testingv1.UploadRequest, testingv1.UploadResponse]
						if s, err = client.Upload(ctx); err == nil {
							_, err = s.CloseAndRecv()
						}
					case "server-stream":
						var s grpc.ServerStreamingClient[testingv1.ConsumeResponse]
						if s, err = client.Consume(ctx, &testingv1.ConsumeRequest{}); err == nil {
							_, err = s.Recv()
						}
					case "bidi":
						var s grpc.BidiStreamingClient[testingv1.ChatRequest, testingv1.ChatResponse]
						if s, err = client.Chat(ctx); err == nil {
							_, err = s.Recv()
						}
					}
					o := status.OutcomeOf(err)
					t.Logf("%v %v final=%v: %v", o.Kind, status.ReasonName(o.Reason), o.Final(), err)
					require.Error(t, err)
					require.Equal(t, status.KindNotAdmitted, o.Kind, "this server's own refusal, read as relayed: %v", err)
				})
			}
		}
	}
}

package interceptor_test

// Streams under the refusals, finality, tenant stripping and admission rules
// the unary owner follows: written by a review that checked the stream owner
// against them, and kept as their guards.

import (
	"context"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// streamGuardKinds runs one stream of each kind against svc, through client, and
// returns the stream's result (nil: OK).
var streamGuardKinds = []struct {
	name   string
	method string
	run    func(ctx context.Context, c testingv1.TestServiceClient, opts ...grpc.CallOption) error
}{
	{"server streaming", "Watch", func(ctx context.Context, c testingv1.TestServiceClient, opts ...grpc.CallOption) error {
		st, err := c.Watch(ctx, &testingv1.WatchRequest{Count: 1}, opts...)
		if err != nil {
			return err
		}
		_, err = recvAll(st)
		return err
	}},
	{"client streaming", "Upload", func(ctx context.Context, c testingv1.TestServiceClient, opts ...grpc.CallOption) error {
		st, err := c.Upload(ctx, opts...)
		if err != nil {
			return err
		}
		if err := st.Send(&testingv1.UploadRequest{Value: "u"}); err != nil && err != io.EOF {
			return err
		}
		_, err = st.CloseAndRecv()
		return err
	}},
	{"bidi streaming", "Chat", func(ctx context.Context, c testingv1.TestServiceClient, opts ...grpc.CallOption) error {
		st, err := c.Chat(ctx, opts...)
		if err != nil {
			return err
		}
		if err := st.Send(&testingv1.ChatRequest{Value: "c"}); err != nil && err != io.EOF {
			return err
		}
		_ = st.CloseSend()
		for {
			if _, err := st.Recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}},
}

// streamGuardRefusing is a service whose three stream methods return refuse().
func streamGuardRefusing(refuse func() error) *testsvc.Service {
	return &testsvc.Service{
		WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			return refuse()
		},
		UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			_, _ = st.Recv()
			return refuse()
		},
		ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
			_, _ = st.Recv()
			return refuse()
		},
	}
}

// A stream under an origin with an allowance of 0, refused by its callee
// ALLOWANCE_EXHAUSTED, ends at once (owner.decide), final, keeping the
// callee's message and retry-after (client.result); OnFinish runs once with
// that result and the call's span ends once.
func TestStreamNoAllowanceStopsAtCalleesExhaustion(t *testing.T) {
	for _, k := range streamGuardKinds {
		t.Run(k.name, func(t *testing.T) {
			svc := streamGuardRefusing(func() error {
				return status.WithoutEffect(status.NotAdmitted(status.ReasonAllowanceExhausted,
					status.WithRetryAfter(2*time.Second), status.WithMessage("dependency quota")))
			})
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAllowance(0),
				interceptor.WithClientTracerProvider(tp), fastRetry(3))...))
			var finished []error
			var mu sync.Mutex
			err := k.run(t.Context(), client, grpc.OnFinish(func(err error) { mu.Lock(); finished = append(finished, err); mu.Unlock() }))
			o := status.OutcomeOf(err)
			require.Equal(t, status.ReasonAllowanceExhausted, o.Reason, "%v", err)
			require.True(t, o.Final(), "%v", err)
			require.Equal(t, int64(1), svc.Calls(k.method), "no repeat can be lent a unit")
			ra, ok := status.RetryAfter(err)
			require.True(t, ok && ra > time.Second, "retry-after kept: %v", err)
			msg := grpcstatus.Convert(err).Message()
			require.Equal(t, 1, strings.Count(msg, "dependency quota"), "message %q", msg)
			prefix := strings.SplitN(msg, ":", 2)[0]
			require.Equal(t, 1, strings.Count(msg, prefix+":"), "message %q", msg)
			mu.Lock()
			require.Len(t, finished, 1)
			require.Equal(t, grpcstatus.Convert(err).Proto().String(), grpcstatus.Convert(finished[0]).Proto().String())
			mu.Unlock()
			require.Eventually(t, func() bool { return len(spans.Ended()) == 1 }, time.Second, time.Millisecond)
			require.Len(t, spans.Started(), 1)
		})
	}
}

// A callee of another make sends a final ALLOWANCE_EXHAUSTED (and another
// answers QUEUE_FULL): below or at an origin whose allowance is untouched,
// neither is final, and the stream repeats under its policy; the result
// keeps the callee's message, retry-after and class, and names the last
// try. Every grant is settled (nothing reserved or held).
func TestStreamCalleeRefusalsRepeatAndKeepDetails(t *testing.T) {
	for _, reason := range []status.Reason{status.ReasonAllowanceExhausted, status.ReasonQueueFull} {
		for _, k := range streamGuardKinds {
			t.Run(status.ReasonName(reason)+"/"+k.name, func(t *testing.T) {
				svc := streamGuardRefusing(func() error {
					return status.NotAdmitted(reason, status.Final(), status.WithClass("heavy"),
						status.WithRetryAfter(time.Millisecond), status.WithMessage("quota"))
				})
				if reason == status.ReasonQueueFull {
					svc = streamGuardRefusing(func() error {
						return status.NotAdmitted(reason, status.WithClass("heavy"),
							status.WithRetryAfter(time.Millisecond), status.WithMessage("quota"))
					})
				}
				end := testsvc.StartT(t, testsvc.Bufconn, svc.Register) // not tollgate's server
				client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
				ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
				require.NoError(t, err)
				var finishes atomic.Int32
				err = k.run(ctx, client, grpc.OnFinish(func(error) { finishes.Add(1) }))
				o := status.OutcomeOf(err)
				require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
				require.Equal(t, reason, o.Reason, "%v", err)
				require.False(t, o.Final(), "%v", err)
				require.Equal(t, int64(3), svc.Calls(k.method), "repeated under the policy")
				require.Equal(t, "heavy", o.Detail.GetWorkloadClass(), "%v", err)
				if reason == status.ReasonAllowanceExhausted { // rebuilt here (client.result)
					require.Equal(t, uint32(3), o.Detail.GetTry(), "%v", err)
				}
				ra, ok := status.RetryAfter(err)
				require.True(t, ok && ra > 0, "%v", err)
				msg := grpcstatus.Convert(err).Message()
				require.Equal(t, 1, strings.Count(msg, "quota"), "message %q", msg)
				require.Equal(t, int32(1), finishes.Load())
				ledger, _ := budget.FromContext(ctx)
				snap := ledger.Snapshot()
				require.Zero(t, snap.Reserved, "%+v", snap)
			})
		}
	}
}

// A stream server handler whose client is untrusted gets its incoming
// metadata without the tollgate header through ss.Context(), and can still
// send a header and set a trailer through grpc.SendHeader/SetTrailer on that
// context; the client sees both, and the interceptor's own trailer.
func TestUntrustedStreamHandlerMetadataHeaderTrailer(t *testing.T) {
	for _, withAdmission := range []bool{false, true} {
		for _, k := range streamGuardKinds {
			name := k.name
			if withAdmission {
				name += " with admission"
			}
			t.Run(name, func(t *testing.T) {
				type seen struct {
					x, tg          []string
					hdrErr, trlErr error
				}
				got := make(chan seen, 4)
				handle := func(ctx context.Context) {
					md, _ := metadata.FromIncomingContext(ctx)
					s := seen{x: md.Get("x-k"), tg: md.Get("tollgate")}
					s.hdrErr = grpc.SendHeader(ctx, metadata.Pairs("h-k", "hv"))
					s.trlErr = grpc.SetTrailer(ctx, metadata.Pairs("t-k", "tv"))
					got <- s
				}
				svc := &testsvc.Service{
					WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
						handle(st.Context())
						return st.Send(&testingv1.WatchResponse{Value: "w"})
					},
					UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
						handle(st.Context())
						n, err := testsvc.DrainUpload(st)
						if err != nil {
							return err
						}
						return st.SendAndClose(&testingv1.UploadResponse{Count: n})
					},
					ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
						handle(st.Context())
						return echoChat(st, nil)
					},
				}
				opts := []interceptor.ServerOption{interceptor.WithClockSkew(0)} // trusts nobody
				if withAdmission {
					ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 2, QueueItems: 2}),
						admission.WithDefaultClass("work"))
					require.NoError(t, err)
					t.Cleanup(func() { _ = ctrl.Close() })
					opts = append(opts, interceptor.WithAdmission(ctrl))
				}
				end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(opts...)...)
				client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
				ctx := metadata.AppendToOutgoingContext(t.Context(), "x-k", "xv")
				var hdr, trl metadata.MD
				err := k.run(ctx, client, grpc.Header(&hdr), grpc.Trailer(&trl))
				require.NoError(t, err)
				s := <-got
				require.Equal(t, []string{"xv"}, s.x, "the caller's other metadata reaches the handler")
				require.Empty(t, s.tg, "the untrusted header is taken out")
				require.NoError(t, s.hdrErr)
				require.NoError(t, s.trlErr)
				require.Equal(t, []string{"hv"}, hdr.Get("h-k"), "header %v", hdr)
				require.Equal(t, []string{"tv"}, trl.Get("t-k"), "trailer %v", trl)
				require.Equal(t, []string{"0"}, trl.Get("tollgate-spent"), "an untrusted caller is told it spent nothing: %v", trl)
			})
		}
	}
}

// A stream admitted with Stream: true holds exactly one slot while it
// runs, gives it back once when it ends, and teaches the class no service
// time; a stream answered before its handler ran holds none after.
func TestStreamHoldsOneSlotAndAbandonsOnce(t *testing.T) {
	for _, k := range streamGuardKinds {
		t.Run(k.name, func(t *testing.T) {
			ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 3, QueueItems: 2,
				ExpectedServiceTime: 50 * time.Millisecond}), admission.WithDefaultClass("work"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ctrl.Close() })
			running := make(chan int, 1)
			hold := func() {
				s, _ := ctrl.Stats().Class("work")
				running <- s.UsedSlots*100 + s.Running
			}
			svc := &testsvc.Service{
				WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
					hold()
					time.Sleep(20 * time.Millisecond)
					return st.Send(&testingv1.WatchResponse{Value: "w"})
				},
				UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
					hold()
					time.Sleep(20 * time.Millisecond)
					n, err := testsvc.DrainUpload(st)
					if err != nil {
						return err
					}
					return st.SendAndClose(&testingv1.UploadResponse{Count: n})
				},
				ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
					hold()
					time.Sleep(20 * time.Millisecond)
					for {
						if _, err := st.Recv(); err != nil {
							if err == io.EOF {
								return nil
							}
							return err
						}
					}
				},
			}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
			before, _ := ctrl.Stats().Class("work")
			require.NoError(t, k.run(t.Context(), client))
			require.Equal(t, 101, <-running, "one slot used, one running")
			require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.UsedSlots == 0 && s.Running == 0 },
				time.Second, time.Millisecond)
			after, _ := ctrl.Stats().Class("work")
			require.Equal(t, before.ServiceMean, after.ServiceMean, "a stream teaches no service time")
			require.Equal(t, before.Admitted+1, after.Admitted)
		})
	}
}

// A recorded stream's first try refused ATTEMPT_UNVERIFIABLE by a store
// built after the attempt was minted ends NOT_ADMITTED, final, and its
// grant comes back, as for a unary call (owner.decide with names).
func TestStreamUnverifiableFirstTryRefundsItsGrant(t *testing.T) {
	for _, k := range streamGuardKinds[1:] { // Watch is NO_SIDE_EFFECTS: no records
		t.Run(k.name, func(t *testing.T) {
			ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)
			minted := time.Now()
			for time.Now().UnixMilli() <= minted.UnixMilli() {
				time.Sleep(time.Millisecond)
			}
			var ran atomic.Int32
			svc := &testsvc.Service{
				UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
					ran.Add(1)
					n, err := testsvc.DrainUpload(st)
					if err != nil {
						return err
					}
					return st.SendAndClose(&testingv1.UploadResponse{Count: n})
				},
				ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
					ran.Add(1)
					return nil
				},
			}
			end := recordedServer(t, svc, memoryStore(t))
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
			var finishes atomic.Int32
			err = k.run(ctx, client, grpc.OnFinish(func(error) { finishes.Add(1) }))
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason, "%v", err)
			require.True(t, o.Final())
			require.Zero(t, ran.Load())
			require.Equal(t, int32(1), finishes.Load())
			led, _ := budget.FromContext(ctx)
			snap := led.Snapshot()
			require.Zero(t, snap.Held+snap.Reserved, "%+v", snap)
			require.Equal(t, int64(4), snap.Free, "%+v", snap)
		})
	}
}

// A server that minted its attempt (its caller untrusted) seals its ledger
// when its handler answers: a stream a goroutine opens after that is
// refused before anything is sent, ALLOWANCE_EXHAUSTED, final; OnFinish runs
// once with that refusal.
func TestSealedMintingServerStreamSendsNothing(t *testing.T) {
	for _, k := range streamGuardKinds {
		t.Run(k.name, func(t *testing.T) {
			leaf := &testsvc.Service{
				WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error { return nil },
				UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
					_, err := testsvc.DrainUpload(st)
					if err != nil {
						return err
					}
					return st.SendAndClose(&testingv1.UploadResponse{})
				},
				ChatFunc: func(grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error { return nil },
			}
			leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
			leafClient := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions()...))
			answered := make(chan struct{})
			late := make(chan error, 1)
			var finishes atomic.Int32
			mid := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
				go func() {
					<-answered
					late <- k.run(context.WithoutCancel(ctx), leafClient, grpc.OnFinish(func(error) { finishes.Add(1) }))
				}()
				return &testingv1.GetResponse{}, nil
			}}
			midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register,
				interceptor.ServerOptions(interceptor.WithClockSkew(0), interceptor.WithDefaultAllowance(4))...)
			_, err := testingv1.NewTestServiceClient(midEnd.DialT(t)).Get(t.Context(), &testingv1.GetRequest{})
			require.NoError(t, err)
			close(answered)
			lateErr := <-late
			require.Zero(t, leaf.Calls(k.method), "%v", lateErr)
			o := status.OutcomeOf(lateErr)
			require.Equal(t, status.ReasonAllowanceExhausted, o.Reason, "%v", lateErr)
			require.True(t, o.Final(), "%v", lateErr)
			require.Equal(t, int32(1), finishes.Load())
		})
	}
}

package interceptor_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A second review found that be8037d gave back the retry-budget token of a
// repeat that never left the client where a stream's try is settled
// (finishTryLocked, which a panic below the interceptor reaches too) and
// where a unary try returns, but not where a unary try panics below the
// interceptor (owner.invoke settles it in its deferred function): a repeat
// an inner interceptor panicked on before anything was sent kept its
// token, though its unit went back to the allowance, and a caller that
// recovered the panic found the target's budget short by one.
//
// The target's budget holds one token and never refills. Call A's first
// try is shed; its repeat panics in an inner interceptor before it calls
// the invoker (never sent). Call B is shed once and must then be repeated
// with that token.
func TestRetryTokenOfARepeatThatPanickedBeforeSendingGoesBack(t *testing.T) {
	var bRuns atomic.Int32
	svc := &testsvc.Service{
		GetFunc: func(_ context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			if r.GetKey() == "a" {
				return nil, shed()
			}
			if bRuns.Add(1) == 1 {
				return nil, shed()
			}
			return &testingv1.GetResponse{Value: "ok"}, nil
		},
		WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			return shed()
		},
	}
	for _, kind := range []string{"unary", "stream"} {
		t.Run(kind, func(t *testing.T) {
			bRuns.Store(0)
			var aTries atomic.Int32
			unaryPanics := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if r, ok := req.(*testingv1.GetRequest); ok && r.GetKey() == "a" && aTries.Add(1) > 1 {
					panic("an inner interceptor panics on the repeat, before sending it")
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			streamPanics := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				if method == testingv1.TestService_Watch_FullMethodName && aTries.Add(1) > 1 {
					panic("an inner interceptor panics on the repeat, before sending it")
				}
				return streamer(ctx, desc, cc, method, opts...)
			}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			dial := append(interceptor.DialOptions(fastRetry(3),
				oneRetryToken()),
				grpc.WithChainUnaryInterceptor(unaryPanics), grpc.WithChainStreamInterceptor(streamPanics))
			client := testingv1.NewTestServiceClient(end.DialT(t, dial...))

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			func() {
				defer func() { require.NotNil(t, recover(), "precondition: call A's repeat panics") }()
				if kind == "unary" {
					_, _ = client.Get(ctx, &testingv1.GetRequest{Key: "a"})
					return
				}
				st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "a"})
				if err == nil {
					_, _ = st.Recv()
				}
			}()
			require.EqualValues(t, 2, aTries.Load(), "precondition: call A's repeat was reached")

			requireCallBGetsTheToken(t, client, &bRuns)
		})
	}
}

// 530263d declines a jump past a fence an ATTEMPT_FENCED refusal tells of
// when the target keeps no records at some backends; its test is unary.
// Streams decide through the same owner (afterTryLocked), and must decline
// it too: a client-streaming and a bidi call under an explicit key, whose
// first run's try ran at a store-less backend and was lost, and whose
// second run is refused ATTEMPT_FENCED by the first run's fence, do not
// run the handler again.
func TestToldFenceAtAMixedTargetIsNotJumpedByStreams(t *testing.T) {
	for _, kind := range []string{"upload", "chat"} {
		t.Run(kind, func(t *testing.T) {
			var (
				effects, tries atomic.Int64
				warmAttempt    atomic.Value
			)
			unaryOuter := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				if r, ok := req.(*tollgatev1.FenceAttemptRequest); ok && warmAttempt.Load() == r.GetAttemptId() {
					return nil, grpcstatus.Error(codes.Unimplemented, "no records")
				}
				return handler(ctx, req)
			})
			streamOuter := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
				if len(metadata.ValueFromIncomingContext(ss.Context(), "x-warm")) > 0 {
					if hdr := metadata.ValueFromIncomingContext(ss.Context(), "tollgate"); len(hdr) == 1 {
						warmAttempt.Store(fieldOf(hdr[0], "a"))
					}
					return grpcstatus.Error(codes.Unavailable, "connection reset")
				}
				if tries.Add(1) == 1 {
					effects.Add(1) // the store-less backend runs it; its answer is lost
					return grpcstatus.Error(codes.Unavailable, "connection reset")
				}
				return handler(srv, ss)
			})
			svc := &testsvc.Service{
				UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
					effects.Add(1)
					for {
						if _, err := st.Recv(); err != nil {
							return st.SendAndClose(&testingv1.UploadResponse{})
						}
					}
				},
				ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
					effects.Add(1)
					for {
						if _, err := st.Recv(); err != nil {
							return nil
						}
					}
				},
			}
			cli := fastClient(t, recordedServer(t, svc, memoryStore(t), unaryOuter, streamOuter), 3)
			call := func(ctx context.Context) error {
				if kind == "upload" {
					st, err := cli.Upload(ctx)
					if err != nil {
						return err
					}
					if err := st.Send(&testingv1.UploadRequest{Value: "k"}); err != nil && err != io.EOF {
						return err
					}
					_, err = st.CloseAndRecv()
					return err
				}
				st, err := cli.Chat(ctx)
				if err != nil {
					return err
				}
				if err := st.Send(&testingv1.ChatRequest{Value: "k"}); err != nil && err != io.EOF {
					return err
				}
				if err := st.CloseSend(); err != nil {
					return err
				}
				for {
					if _, err := st.Recv(); err != nil {
						if err == io.EOF {
							return nil
						}
						return err
					}
				}
			}

			err := call(metadata.AppendToOutgoingContext(t.Context(), "x-warm", "1"))
			require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "precondition: %v", err)

			actx, err := interceptor.StartAttempt(t.Context(), 0, time.Minute)
			require.NoError(t, err)
			actx = interceptor.WithCallKey(actx, "pay")
			err = call(actx)
			require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "precondition: run 1 ends in doubt: %v", err)
			require.Equal(t, int64(1), effects.Load())

			err = call(actx)
			require.Equal(t, int64(1), effects.Load(), "run 2 jumped the fence and ran the handler again: %v", err)
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
			require.NotEmpty(t, o.Detail.GetAttemptId(), "the answer names the attempt")
			require.EqualValues(t, 2, tries.Load(), "run 2 sent one try")
		})
	}
}

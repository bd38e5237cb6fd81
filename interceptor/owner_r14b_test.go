package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A resolution query that an inner client interceptor refused before
// sending it did not reach the callee: its resolution gives its
// retry-budget token back, as a repeat never sent does, so that another
// call's repeat finds it (the budget bounds what is sent to the target).
func TestLocalUnimplementedQueryGivesItsTokenBack(t *testing.T) {
	var bRuns atomic.Int32
	ledger := newLedger(nil)
	ledger.GetFunc = func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if bRuns.Add(1) == 1 {
			return nil, shed()
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch method {
		case fenceAttemptMethod:
			return grpcstatus.Error(codes.Unimplemented, "the allow-list has no AttemptService") // never sent
		case testingv1.TestService_Apply_FullMethodName:
			if err := inv(ctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
			return grpcstatus.Error(codes.Unavailable, "connection reset") // ran; its answer lost
		}
		return inv(ctx, method, req, reply, cc, opts...)
	}
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3),
		interceptor.WithAttemptTimeout(time.Minute), oneRetryToken()),
		grpc.WithChainUnaryInterceptor(inner))...))

	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	require.EqualValues(t, 1, ledger.effects.Load())
	requireCallBGetsTheToken(t, client, &bRuns)
}

// A stream owner's resolution query goes through the stream interceptors
// below tollgate's: one refused there with UNIMPLEMENTED before it was sent
// says nothing of the callee, and marks its target as keeping no records
// no more than a unary call's does — an IDEMPOTENT call in doubt to the same
// target is still queried, not repeated unqueried.
func TestStreamQueryRefusedLocallyMarksNothing(t *testing.T) {
	var chats, queries atomic.Int32
	svc := &testsvc.Service{
		ChatFunc: drainChat,
		PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			return &testingv1.PutResponse{}, nil
		},
	}
	lose := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod != testingv1.TestService_Chat_FullMethodName || chats.Add(1) != 1 {
			return h(srv, ss)
		}
		_ = h(srv, ss) // recorded SUCCEEDED; the proxy loses the answer
		return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
	})
	end := recordedServer(t, svc, memoryStore(t), lose)
	refuseStreamQuery := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if method == fenceAttemptMethod {
			return nil, grpcstatus.Error(codes.Unimplemented, "the allow-list has no AttemptService") // never sent
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	var lostPut atomic.Bool
	countQueries := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == fenceAttemptMethod {
			queries.Add(1)
		}
		if err := inv(ctx, method, req, reply, cc, opts...); err != nil || method != testingv1.TestService_Put_FullMethodName {
			return err
		}
		if lostPut.CompareAndSwap(false, true) {
			return grpcstatus.Error(codes.Unavailable, "connection reset") // ran; its answer lost
		}
		return nil
	}
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3),
		interceptor.WithoutRetryBudget(), interceptor.WithAttemptTimeout(time.Minute)),
		grpc.WithChainStreamInterceptor(refuseStreamQuery), grpc.WithChainUnaryInterceptor(countQueries))...))

	err := chatOnce(t, t.Context(), client)
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "the query failed before it was sent: %v", err)
	require.EqualValues(t, 1, chats.Load(), "the stream was not repeated")

	_, err = client.Put(t.Context(), &testingv1.PutRequest{Key: "b"})
	require.NoError(t, err)
	require.EqualValues(t, 1, queries.Load(), "the IDEMPOTENT call in doubt asked the target, which was never found to keep no records")
}

// A resolution whose first poll reached the callee (IN_PROGRESS) and whose
// next poll an inner interceptor refused with UNIMPLEMENTED before sending
// it: each poll has its own delivery record, so the first poll's answer
// does not make the later local refusal read as the callee's — the target
// is not marked as keeping no records — while the resolution, which did
// reach the callee, keeps its retry-budget token.
func TestLocalUnimplementedAfterAnInProgressPoll(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	ledger := newLedger(func(context.Context, *testingv1.ApplyRequest) {
		started <- struct{}{}
		<-release
	})
	var bRuns atomic.Int32
	ledger.GetFunc = func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if bRuns.Add(1) == 1 {
			return nil, shed()
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	var polls atomic.Int32
	inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch method {
		case fenceAttemptMethod:
			if polls.Add(1) >= 2 {
				return grpcstatus.Error(codes.Unimplemented, "the allow-list has no AttemptService") // never sent
			}
		case testingv1.TestService_Apply_FullMethodName:
			// The client stops waiting once the handler began (detached
			// by the store, it goes on).
			tctx, cancel := context.WithCancel(ctx)
			defer cancel()
			go func() {
				select {
				case <-started:
					cancel()
				case <-tctx.Done():
				}
			}()
			return inv(tctx, method, req, reply, cc, opts...)
		}
		return inv(ctx, method, req, reply, cc, opts...)
	}
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3),
		interceptor.WithAttemptTimeout(time.Minute), oneRetryToken()),
		grpc.WithChainUnaryInterceptor(inner))...))

	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	close(release)
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	require.EqualValues(t, 2, polls.Load(), "one poll answered IN_PROGRESS, the next was refused locally")

	// The first poll reached the callee: the resolution's token stays
	// spent, and call B finds none for its repeat.
	_, err = client.Get(t.Context(), &testingv1.GetRequest{Key: "b"})
	require.Equal(t, status.ReasonRetryBudgetExhausted, status.OutcomeOf(err).Reason,
		"the resolution's token came back though its first poll was sent: %v", err)
	require.EqualValues(t, 1, bRuns.Load())
}

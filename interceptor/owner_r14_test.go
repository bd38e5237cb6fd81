package interceptor_test

import (
	"context"
	"io"
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
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A resolution query that an inner client interceptor refused with
// UNIMPLEMENTED without sending it (an allow-list of services, say) marked
// the target as keeping no records, exactly as a callee's own UNIMPLEMENTED
// does: for a minute every IDEMPOTENT call to that target in doubt was
// repeated without the query, and every other call's FENCED answers and
// finished records were taken as not vouching for its tries (unvouched),
// although the callee keeps records and was never asked. Only an
// UNIMPLEMENTED the peer sent (its status arrived) says the callee has no
// AttemptService.
func TestLocalUnimplementedQueryMarksNothing(t *testing.T) {
	var puts, queriesSent, refusals atomic.Int32
	svc := &testsvc.Service{PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		puts.Add(1)
		return &testingv1.PutResponse{}, nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	lost := map[string]bool{}
	inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch method {
		case fenceAttemptMethod:
			if refusals.Add(1) == 1 {
				// Refused here, never sent.
				return grpcstatus.Error(codes.Unimplemented, "the allow-list has no AttemptService")
			}
			queriesSent.Add(1)
		case testingv1.TestService_Put_FullMethodName:
			if err := inv(ctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
			if k := req.(*testingv1.PutRequest).GetKey(); !lost[k] {
				lost[k] = true // the first try of each key ran; its answer is lost
				return grpcstatus.Error(codes.Unavailable, "connection reset")
			}
			return nil
		}
		return inv(ctx, method, req, reply, cc, opts...)
	}
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3),
		interceptor.WithoutRetryBudget(), interceptor.WithAttemptTimeout(time.Minute)),
		grpc.WithChainUnaryInterceptor(inner))...))

	_, err := client.Put(t.Context(), &testingv1.PutRequest{Key: "a"})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "the query failed before it was sent: the try's state is not known (%v)", err)
	require.Zero(t, queriesSent.Load())

	// The target keeps records: call B's try in doubt is queried, not
	// repeated unqueried as at a target without records.
	_, err = client.Put(t.Context(), &testingv1.PutRequest{Key: "b"})
	require.NoError(t, err)
	require.EqualValues(t, 1, queriesSent.Load(), "call B asked the target, which was never found to keep no records")
	require.EqualValues(t, 2, puts.Load(), "each call's handler ran once")
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// The stats handler counted an RPC sent on a re-rooted context (one not
// derived from the context tollgate gave the inner interceptor) only when
// it carried a try's header, with the attempt's deadline: a resolution
// query carries only the attempt and the tenant. A FenceAttempt query that
// an inner interceptor re-rooted so reached the callee, which fenced the
// try, but its delivery record saw nothing, and when its answer was then
// lost the resolution read as never sent and gave its retry-budget token
// back: the budget, which bounds the repeats and resolutions sent to the
// target, did not count a query that put load on it (and fenced a try).
func TestQueryOnAReRootedContextKeepsItsToken(t *testing.T) {
	var bRuns, queries atomic.Int32
	ledger := newLedger(nil)
	ledger.GetFunc = shedFirstGet(&bRuns)
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch method {
		case fenceAttemptMethod:
			queries.Add(1)
			md, _ := metadata.FromOutgoingContext(ctx)
			rctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
			defer cancel()
			if err := inv(rctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
			return grpcstatus.Error(codes.Unavailable, "answer lost") // the callee fenced the try
		case testingv1.TestService_Apply_FullMethodName:
			if err := inv(ctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
			return grpcstatus.Error(codes.DeadlineExceeded, "answer lost")
		}
		return inv(ctx, method, req, reply, cc, opts...)
	}
	client := oneTokenClient(t, end, inner)

	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	require.EqualValues(t, 1, queries.Load())
	require.EqualValues(t, 1, ledger.effects.Load())

	// The query was sent: its token stays spent, and call B finds none for
	// its repeat.
	requireCallBFindsNoToken(t, client, &bRuns, "the resolution's token came back though its query was sent")
}

// spendOne spends one unit of the handler's allowance, as its own
// downstream work would.
func spendOne(t *testing.T, ctx context.Context) {
	a, ok := budget.FromContext(ctx)
	if !ok {
		t.Error("the handler has no ledger") // not require: the server's goroutine
		return
	}
	if err := a.Take(); err != nil { // its downstream work spends the one unit
		t.Errorf("the handler could not spend its unit: %v", err)
	}
}

// loseFirstChatAnswer is a server stream interceptor, chained outside
// tollgate's, that lets the first Chat try it sees run (its record is
// SUCCEEDED) and then loses that try's answer, as a proxy whose upstream
// connection reset would. It counts the Chat tries it sees in tries; other
// streams pass through uncounted.
func loseFirstChatAnswer(tries *atomic.Int32) grpc.ServerOption {
	return grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod != testingv1.TestService_Chat_FullMethodName || tries.Add(1) != 1 {
			return h(srv, ss)
		}
		_ = h(srv, ss) // recorded SUCCEEDED; the proxy loses the answer
		return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
	})
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// At the origin, once the callee reported every unit of the allowance
// spent, the owner refused the repeat locally, ALLOWANCE_EXHAUSTED, and
// that refusal of a try never sent became the call's result. After a try
// whose outcome is not known the call was UNKNOWN all the same, but its
// code, message and cause were the local refusal's (UNKNOWN "the
// attempt's allowance has no free unit", naming try 2): the callee's error,
// which says what may have happened, was lost. The call now ends with the
// try it followed, as when its repeat does not fit the deadline.
func TestRepeatRefusedForSpentAllowanceKeepsTheCalleesError(t *testing.T) {
	t.Run("unary", func(t *testing.T) {
		var runs atomic.Int32
		svc := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			runs.Add(1)
			spendOne(t, ctx)
			return nil, grpcstatus.Error(codes.Internal, "the database failed mid-write")
		}}
		client := fastClient(t, testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...), 3)
		ctx, err := interceptor.StartAttempt(t.Context(), 1, 5*time.Second)
		require.NoError(t, err)
		_, err = client.Get(ctx, &testingv1.GetRequest{Key: "k"})
		requireCalleesError(t, err, "the database failed mid-write")
		require.EqualValues(t, 1, runs.Load(), "the repeat was refused locally")
	})
	t.Run("stream", func(t *testing.T) {
		var runs atomic.Int32
		svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			runs.Add(1)
			spendOne(t, st.Context())
			return grpcstatus.Error(codes.Internal, "the feed failed")
		}}
		client := fastClient(t, testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...), 3)
		ctx, err := interceptor.StartAttempt(t.Context(), 1, 5*time.Second)
		require.NoError(t, err)
		st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "k"})
		if err == nil {
			_, err = st.Recv()
		}
		requireCalleesError(t, err, "the feed failed")
		require.EqualValues(t, 1, runs.Load(), "the repeat was refused locally")
	})
}

// requireCalleesError requires err to be UNKNOWN with the callee's error
// (INTERNAL, saying msg) as its cause, naming try 1, the last try sent.
func requireCalleesError(t *testing.T, err error, msg string) {
	t.Helper()
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "the try in doubt may have taken effect: %v", err)
	require.Equal(t, codes.Internal, grpcstatus.Code(err), "the callee's code, not a local refusal's: %v", err)
	require.Contains(t, grpcstatus.Convert(err).Message(), msg, "the callee's error is kept")
	require.NotEqual(t, status.ReasonAllowanceExhausted, o.Reason, "%v", err)
	require.EqualValues(t, 1, o.Detail.GetTry(), "the result names the last try sent: %v", err)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A verifying try (the one that asks the store, with the request, about a
// finished record found under the call's explicit key after a try in doubt)
// refused locally below the origin for lack of a unit ended the call with
// that local refusal: UNKNOWN, since the earlier try was in doubt, but
// with the refusal's code and message, naming a try never sent, and the
// callee's error lost. It now ends with the try in doubt's own outcome.
func TestVerifyingTryRefusedLocallyKeepsTheCalleesError(t *testing.T) {
	ledger := newLedger(nil)
	leaf := recordedServer(t, &ledger.Service, memoryStore(t))
	var lost atomic.Bool
	lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := inv(ctx, method, req, reply, cc, opts...); err != nil || method != testingv1.TestService_Apply_FullMethodName {
			return err
		}
		if lost.CompareAndSwap(false, true) {
			return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
		}
		return nil
	}
	toLeaf := testingv1.NewTestServiceClient(leaf.DialT(t, append(interceptor.DialOptions(fastRetry(3),
		interceptor.WithoutRetryBudget()), grpc.WithChainUnaryInterceptor(lose))...))
	leafErr := make(chan error, 1)
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		_, err := toLeaf.Apply(interceptor.WithCallKey(ctx, "pay"), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
		leafErr <- err
		return &testingv1.GetResponse{}, nil
	}}
	origin := fastClient(t, testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...), 1)
	ctx, err := interceptor.StartAttempt(t.Context(), 1, 5*time.Second) // mid gets one unit: its first try's
	require.NoError(t, err)
	_, err = origin.Get(ctx, &testingv1.GetRequest{})
	require.NoError(t, err)
	err = <-leafErr
	o := status.OutcomeOf(err)
	require.EqualValues(t, 1, ledger.effects.Load())
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotEqual(t, status.ReasonAllowanceExhausted, o.Reason, "%v", err)
	require.Equal(t, codes.Internal, grpcstatus.Code(err), "the callee's code, not a local refusal's: %v", err)
	require.Contains(t, grpcstatus.Convert(err).Message(), "upstream connection reset", "the callee's error is kept")
	require.EqualValues(t, 1, o.Detail.GetTry(), "the result names the last try sent: %v", err)
}

// chatWhoseVerifyingTryFindsNoUnit runs one Chat keyed "chat", in an
// attempt of one unit, at a recorded server whose handler spends that unit
// (spendOne) and whose first answer a proxy loses (loseFirstChatAnswer), so
// that the stream owner's verifying try, at the origin, finds no unit left.
// It returns how many times the handler ran, how many Chat tries reached the
// server, and the stream's error (chatOnce).
func chatWhoseVerifyingTryFindsNoUnit(t *testing.T) (runs int64, tries int32, err error) {
	t.Helper()
	var handlerRuns atomic.Int64
	var served atomic.Int32
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		handlerRuns.Add(1)
		spendOne(t, st.Context())
		return drainChat(st)
	}}
	client := fastClient(t, recordedServer(t, svc, memoryStore(t), loseFirstChatAnswer(&served)), 3)
	ctx, err := interceptor.StartAttempt(t.Context(), 1, 5*time.Second)
	require.NoError(t, err)
	err = chatOnce(t, interceptor.WithCallKey(ctx, "chat"), client)
	return handlerRuns.Load(), served.Load(), err
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A stream's verifying try refused locally for lack of a unit ended the
// stream UNKNOWN with the local refusal's code and message, the callee's
// error lost, as the unary owner's did (see
// TestVerifyingTryRefusedLocallyKeepsTheCalleesError). The review met it at
// the origin, which (since r15, TestStreamVerifyingTryAgreesWithUnary)
// sends its verifying try past a spent allowance, as a unary call's; below
// the origin the verifying try takes a unit as any RPC does, and is refused
// locally when none is free: here a middle tier whose one unit its Chat's
// first try took. The stream ends with the try in doubt's own outcome.
func TestStreamVerifyingTryRefusedLocallyKeepsTheCalleesError(t *testing.T) {
	var runs atomic.Int64
	var served atomic.Int32
	leafSvc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		runs.Add(1)
		return drainChat(st)
	}}
	leaf := recordedServer(t, leafSvc, memoryStore(t), loseFirstChatAnswer(&served))
	toLeaf := testingv1.NewTestServiceClient(leaf.DialT(t, interceptor.DialOptions(fastRetry(3), interceptor.WithoutRetryBudget())...))
	leafErr := make(chan error, 1)
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		leafErr <- chatFromHandler(interceptor.WithCallKey(ctx, "chat"), toLeaf)
		return &testingv1.GetResponse{}, nil
	}}
	origin := fastClient(t, testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...), 1)
	ctx, err := interceptor.StartAttempt(t.Context(), 1, 5*time.Second) // mid gets one unit: its Chat's first try's
	require.NoError(t, err)
	_, err = origin.Get(ctx, &testingv1.GetRequest{})
	require.NoError(t, err)
	err = <-leafErr
	require.EqualValues(t, 1, runs.Load(), "the handler ran once")
	require.EqualValues(t, 1, served.Load(), "the verifying try was refused locally")
	requireCalleesError(t, err, "upstream connection reset")
}

// chatFromHandler is chatOnce for a handler's goroutine: it opens a Chat
// under ctx, sends one message, closes its side and returns the error of
// the first Recv, or of whatever failed before it (io.EOF from Send says
// the stream ended: Recv returns how).
func chatFromHandler(ctx context.Context, client testingv1.TestServiceClient) error {
	st, err := client.Chat(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&testingv1.ChatRequest{}); err != nil && err != io.EOF {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	_, err = st.Recv()
	return err
}

// A review asked that the re-rooting checks cost ordinary calls nothing:
// the stats handler counts an RPC as re-rooted only when it carries a
// tollgate header without its delivery record, and a try (or query) that
// saw none of its own events while such a count moved reads as maybe sent.
// Ordinary traffic through DialOptions — unary calls and streams, their
// repeats, resolution queries and verifying tries — never moves either
// count, so no ordinary try is needlessly held as maybe sent.
func TestOrdinaryTrafficMovesNoReRootedCount(t *testing.T) {
	var gets, uploads atomic.Int32
	ledger := newLedger(nil)
	ledger.GetFunc = func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if gets.Add(1) == 1 {
			return nil, shed()
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}
	ledger.WatchFunc = func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		return st.Send(&testingv1.WatchResponse{Value: "v"})
	}
	ledger.UploadFunc = func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		_, _ = testsvc.DrainUpload(st)
		if uploads.Add(1) == 1 {
			return shed()
		}
		return st.SendAndClose(&testingv1.UploadResponse{})
	}
	var lostApply atomic.Int32
	lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := inv(ctx, method, req, reply, cc, opts...); err != nil || method != testingv1.TestService_Apply_FullMethodName {
			return err
		}
		if lostApply.Add(1) <= 2 { // each call's first try
			return grpcstatus.Error(codes.Unavailable, "connection reset") // ran; its answer lost
		}
		return nil
	}
	ledger.ChatFunc = drainChat
	var chats atomic.Int32
	end := recordedServer(t, &ledger.Service, memoryStore(t), loseFirstChatAnswer(&chats))
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3),
		interceptor.WithAttemptTimeout(time.Minute)), grpc.WithChainUnaryInterceptor(lose))...))

	tries, queries := interceptor.RerootedTries(), interceptor.RerootedQueries()
	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "k"}) // shed, then repeated
	require.NoError(t, err)
	_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "a", Amount: 1}) // lost, queried
	require.NoError(t, err)
	_, err = client.Apply(interceptor.WithCallKey(t.Context(), "pay"), &testingv1.ApplyRequest{Key: "a", Amount: 1}) // lost, queried, verified
	require.NoError(t, err)
	ws, err := client.Watch(t.Context(), &testingv1.WatchRequest{Key: "k"})
	require.NoError(t, err)
	_, err = recvAll[*testingv1.WatchResponse](ws)
	require.NoError(t, err)
	us, err := client.Upload(t.Context()) // shed, then replayed
	require.NoError(t, err)
	require.NoError(t, us.Send(&testingv1.UploadRequest{}))
	_, err = us.CloseAndRecv()
	require.NoError(t, err)
	err = chatOnce(t, t.Context(), client) // lost, queried by the stream's owner
	require.Equal(t, status.KindCommitted, status.OutcomeOf(err).Kind, "%v", err)

	require.Equal(t, tries, interceptor.RerootedTries(), "an ordinary try was counted as re-rooted")
	require.Equal(t, queries, interceptor.RerootedQueries(), "an ordinary query was counted as re-rooted")
	require.EqualValues(t, 2, ledger.effects.Load(), "each Apply ran once")
	require.EqualValues(t, 2, gets.Load())
	require.EqualValues(t, 2, uploads.Load())
}

package interceptor_test

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
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

// A review found that an IDEMPOTENT call whose try 1 took effect and was
// lost, at a callee that keeps no records (its query UNIMPLEMENTED), was
// repeated without the query, as DESIGN.md §3.5 allows, and that the
// repeat's definite error (ALREADY_EXISTS: try 1 made the thing) was
// returned FAILED, as if the call had no effect. A call's outcome combines
// all its tries: try 1's is still unknown, so the call is UNKNOWN (keeping
// the repeat's code and message).
func TestUnqueriedRepeatsDefiniteErrorStaysUnknown(t *testing.T) {
	var effects, tries atomic.Int64
	svc := &testsvc.Service{PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		if tries.Add(1) == 1 {
			effects.Add(1) // it took effect; the answer is lost
			return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
		}
		return nil, grpcstatus.Error(codes.AlreadyExists, "k exists")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...) // no store, no AttemptService
	_, err := fastClient(t, end, 3).Put(t.Context(), &testingv1.PutRequest{Key: "k"})
	require.Equal(t, int64(2), tries.Load(), "precondition: try 2 was sent without a query")
	require.Equal(t, int64(1), effects.Load())
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "try 1 may have taken effect: %v", err)
	require.Equal(t, codes.AlreadyExists, grpcstatus.Code(err), "the repeat's code is kept")
	require.NotEmpty(t, o.Detail.GetAttemptId(), "the answer names the attempt")
}

// A call keyed explicitly whose lost try the store backend recorded
// SUCCEEDED sends a verifying try, which a backend without a store would
// run as a new call. The owner declines to send it for a method with side
// effects once its target is known to keep no records at some backends
// (TestUnvouchedVerifyingTryDoesNotRerunAMethodWithSideEffects); a review
// found that it asked only when the query answered, so a mark that came
// after that answer and before the verifying try was sent (here: another
// call's query, answered UNIMPLEMENTED by the store-less backend, made
// when the owner next reads its clock) went unheeded, and the verifying try
// ran the handler again there. It is asked again when the verifying try is
// about to be sent.
func TestMarkBeforeVerifyingTryIsHeeded(t *testing.T) {
	var effects, kTries atomic.Int64
	m := &lateMark{}
	end := m.server(t, lateMarkService(&effects), true, func(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
		return verifyAtStoreless(ctx, req, handler, &kTries, &effects)
	}, nil)
	cli := m.dial(t, end)
	_, err := cli.Apply(interceptor.WithCallKey(t.Context(), "pay"), &testingv1.ApplyRequest{Key: "k"})
	m.requireHeeded(t, err, &kTries, &effects, "try 1 was resolved at the store backend, and the warm-up call marked the target",
		"the target was marked recordless before the verifying try was sent: it must not run the handler again")
}

// TestMarkBeforeVerifyingTryIsHeeded for a stream, whose verifying try is
// sent at once as a unary call's is: a mark that comes after the query
// answered (when the owner next reads its clock, as it prepares the try) is
// heeded before the try is sent.
func TestMarkBeforeStreamVerifyingTryIsHeeded(t *testing.T) {
	var effects, tries atomic.Int64
	m := &lateMark{}
	end := m.server(t, lateMarkService(&effects), true, nil, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if tries.Add(1) == 1 { // the store backend runs and records it; the answer is lost
			_ = h(srv, ss)
			return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
		}
		effects.Add(1) // the verifying try reaches the store-less backend
		return nil
	})
	cli := m.dial(t, end)
	err := chatOnce(t, interceptor.WithCallKey(t.Context(), "chat"), cli)
	m.requireHeeded(t, err, &tries, &effects, "try 1 was resolved at the store backend, and the warm-up call marked the target",
		"the target was marked recordless before the verifying try was sent: it must not run the handler again")
}

// A review found that the repeat after a FENCED answer had the same window
// as the verifying try (TestMarkBeforeVerifyingTryIsHeeded): resolve
// declines to repeat a method with side effects whose target is known to
// keep no records at some backends, since the fence vouches only for its
// own store, but it asked only when the query answered. Here try 1 runs at
// the store-less backend (its answer lost), the query fences it at the
// store backend, and another call's query marks the target recordless
// before the repeat is sent: the repeat ran the handler a second time. It
// is asked again when the repeat is about to be sent, and the call ends
// UNKNOWN with the handler run once.
func TestMarkBeforeRepeatAfterFenceIsHeeded(t *testing.T) {
	var effects, kTries atomic.Int64
	m := &lateMark{}
	// Query 1: the store backend fences try 1.
	end := m.server(t, lateMarkService(&effects), true, func(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
		if kTries.Add(1) == 1 {
			// The store-less backend: try 1 runs there; its answer is lost.
			effects.Add(1)
			return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
		}
		return handler(ctx, req)
	}, nil)
	cli := m.dial(t, end)
	_, err := cli.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	m.requireHeeded(t, err, &kTries, &effects, "try 1 was fenced at the store backend, and the warm-up call marked the target",
		"the target was marked recordless before the repeat was sent: try 1 may have run there, and the handler must not run again")
}

// TestMarkBeforeRepeatAfterFenceIsHeeded when the mark comes later still:
// the repeat after the fence, try 2, is refused without effect, and the
// target is marked recordless before try 3. The fence still vouches only
// for its own store, and try 1 may have run where none is kept: try 3 is
// not sent either.
func TestMarkBeforeLaterRepeatAfterFenceIsHeeded(t *testing.T) {
	var effects, kTries atomic.Int64
	m := &lateMark{}
	// Query 1: the store backend fences try 1, and arms nothing.
	end := m.server(t, lateMarkService(&effects), false, func(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
		switch kTries.Add(1) {
		case 1: // the store-less backend runs it; the answer is lost
			effects.Add(1)
			return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
		case 2: // refused without effect; the mark comes before try 3
			m.armed.Store(true)
			return nil, queueFull()
		}
		return handler(ctx, req)
	}, nil)
	cli := m.dial(t, end)
	_, err := cli.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	m.requireHeeded(t, err, &kTries, &effects, "try 1 was fenced at the store backend, and the warm-up call marked the target",
		"the target was marked recordless before try 3 was sent: try 1 may have run there, and the handler must not run again")
	require.Equal(t, int64(2), kTries.Load(), "try 3 is not sent")
}

// TestMarkBeforeRepeatAfterFenceIsHeeded for a stream: a mark that comes
// during the repeat's backoff is heeded before the repeat is sent.
func TestMarkBeforeStreamRepeatAfterFenceIsHeeded(t *testing.T) {
	var effects, tries atomic.Int64
	m := &lateMark{}
	// Query 1: the store backend fences try 1.
	end := m.server(t, lateMarkService(&effects), true, nil, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if tries.Add(1) == 1 { // the store-less backend runs it; the answer is lost
			effects.Add(1)
			return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
		}
		return h(srv, ss) // the repeat reaches the store backend, past the fence
	})
	cli := m.dial(t, end)
	err := chatOnce(t, t.Context(), cli)
	m.requireHeeded(t, err, &tries, &effects, "try 1 was fenced at the store backend, and the warm-up call marked the target",
		"the target was marked recordless before the repeat was sent: try 1 may have run there, and the handler must not run again")
}

// A review found that a middle server that does not speak tollgate (plain
// grpc-go) and passes up its callee's tollgate refusal as it came handed
// the origin a NOT_ADMITTED, which the origin took as "no effect" and
// repeated, although the middle's handler ran (and may have taken effect)
// before it called down. A tollgate server names the attempt of the try it
// refuses — the caller's, or, for a caller it does not trust, one it
// minted, and then it reports tollgate-spent 0 — so a refusal naming
// another attempt without tollgate-spent is now UNKNOWN. (A middle that
// forwards its incoming tollgate header makes its callee name the origin's
// own try: that case cannot be told, and the README says so.)
func TestPlainMiddleRelayingARefusalIsUnknown(t *testing.T) {
	dep := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		// The callee refuses without effect (as its admission would).
		return nil, queueFull()
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	down := testingv1.NewTestServiceClient(depEnd.DialT(t)) // plain grpc-go: no tollgate interceptors
	var midRuns atomic.Int64
	mid := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		midRuns.Add(1) // the middle's own work, done before it calls down
		return down.Apply(ctx, r)
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register) // plain grpc-go server
	id, err := relayedApply(t, midEnd)
	o := status.OutcomeOf(err)
	t.Logf("middle runs %d, err %v", midRuns.Load(), err)
	require.Equal(t, int64(1), midRuns.Load(), "the middle's handler ran, and is not run again")
	require.Equal(t, status.KindUnknown, o.Kind, "the middle's handler ran before the refusal: %v", err)
	require.Equal(t, id, o.Detail.GetAttemptId(), "the answer names the origin's attempt")
	require.NotContains(t, []codes.Code{codes.ResourceExhausted, codes.Unavailable}, grpcstatus.Code(err),
		"UNKNOWN never carries a code generic policies repeat")
}

// The legitimate refusal TestPlainMiddleRelayingARefusalIsUnknown must not
// catch: a tollgate server that does not trust its caller refuses under an
// attempt it minted, and reports tollgate-spent 0. It stays NOT_ADMITTED.
func TestUntrustedCalleesRefusalStaysNotAdmitted(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return nil, queueFull()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, untrustingServerOpts()...)
	id, err := relayedApply(t, end)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.NotEqual(t, id, o.Detail.GetAttemptId(), "precondition: the callee refused under an attempt it minted")
	require.Equal(t, int64(2), runs.Load(), "a refusal without effect is repeated")
}

// A review asked whether a verifying try should heed a stop-pushback
// (grpc-retry-pushback-ms -1) that the lost try's answer carried. It need
// not: a tollgate server sends -1 only with a final refusal, which ends the
// call before any query; here a proxy adds it to an answer that lost the
// try's response. The verifying try runs nothing (the store answers it from
// the record, as the query did), so it is sent, and the call gets its
// stored response instead of UNKNOWN; the handler ran once.
func TestVerifyingTryAfterAStopPushbackIsAnsweredFromTheRecord(t *testing.T) {
	ledger := newLedger(nil)
	var tries atomic.Int64
	lose := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasSuffix(info.FullMethod, "/Apply") || tries.Add(1) != 1 {
			return handler(ctx, req)
		}
		_, _ = handler(ctx, req) // recorded SUCCEEDED; the proxy loses the answer
		_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", "-1"))
		return nil, grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
	})
	client := fastClient(t, recordedServer(t, &ledger.Service, memoryStore(t), lose), 3)
	resp, err := client.Apply(interceptor.WithCallKey(t.Context(), "pay"), &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	require.NoError(t, err)
	require.Equal(t, int64(7), resp.GetTotal())
	require.Equal(t, int64(2), tries.Load(), "precondition: the verifying try was sent")
	require.Equal(t, int64(1), ledger.effects.Load(), "the handler ran once")
}

// A review asked whether a stream's verifying try, which (unlike a unary
// call's) then went through the origin's allowance checks as any repeat,
// may report a wrong outcome once the allowance is spent. It did not: the
// repeat was refused locally, nothing more ran, and the call ended UNKNOWN,
// honest though less precise than the record. Since r15 (see
// TestStreamVerifyingTryAgreesWithUnary) the stream's verifying try is sent
// past a spent allowance, as a unary call's: it runs nothing below (the
// store answers it from the record), and the stream ends COMMITTED, what
// the record (SUCCEEDED) says.
func TestStreamVerifyingTryAfterAllUnitsSpentStaysHonest(t *testing.T) {
	runs, tries, err := chatWhoseVerifyingTryFindsNoUnit(t)
	o := status.OutcomeOf(err)
	t.Logf("tries %d, err %v", tries, err)
	require.Equal(t, int64(1), runs, "the handler ran once")
	require.EqualValues(t, 2, tries, "the verifying try was sent")
	require.Equal(t, status.KindCommitted, o.Kind, "%v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "the answer names the attempt")
}

// TestUnqueriedRepeatsDefiniteErrorStaysUnknown when the repeat's definite
// error comes back from a record: try 1 runs at the store-less backend (its
// answer lost, its query UNIMPLEMENTED), the repeat runs at the backend with
// a store and fails ALREADY_EXISTS, its answer lost too, and once the
// recordless mark lapsed the query finds that FAILED record. The record
// speaks for the tries its store saw, not for try 1, which took effect: the
// call is UNKNOWN.
func TestUnqueriedRepeatsFailedRecordStaysUnknown(t *testing.T) {
	var effects, queries, offsetNs atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offsetNs.Load())) }
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch {
		case strings.HasSuffix(info.FullMethod, "/FenceAttempt"):
			if queries.Add(1) == 1 {
				return nil, grpcstatus.Error(codes.Unimplemented, "no records") // the store-less backend
			}
		case strings.HasSuffix(info.FullMethod, "/Put"):
			switch headerTry(ctx) {
			case "1": // the store-less backend runs it; the answer is lost
				effects.Add(1)
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			case "2": // the backend with a store records ALREADY_EXISTS; the answer is lost
				_, _ = handler(ctx, req)
				offsetNs.Store(int64(2 * time.Minute)) // the recordless mark lapses
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			}
		}
		return handler(ctx, req)
	})
	svc := &testsvc.Service{PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		return nil, grpcstatus.Error(codes.AlreadyExists, "k exists")
	}}
	client := fastClient(t, recordedServer(t, svc, memoryStore(t), outer), 3,
		interceptor.WithClientClock(clock), interceptor.WithAttemptTimeout(10*time.Minute))
	_, err := client.Put(t.Context(), &testingv1.PutRequest{Key: "k"})
	t.Logf("queries %d, err %v", queries.Load(), err)
	require.Equal(t, int64(2), queries.Load(), "precondition: the second query found try 2's record")
	require.Equal(t, int64(1), effects.Load())
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "try 1 may have taken effect: %v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "the answer names the attempt")
}

// relayedClient dials end with a tollgate client allowed two tries and
// starts a new attempt, returning the client, the attempt's context and its
// ID.
func relayedClient(t *testing.T, end *testsvc.Endpoint) (testingv1.TestServiceClient, context.Context, string) {
	t.Helper()
	client := fastClient(t, end, 2)
	ctx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(ctx)
	return client, ctx, a.ID
}

// relayedApply makes one Apply call through relayedClient, returning the
// attempt's ID and the call's error.
func relayedApply(t *testing.T, end *testsvc.Endpoint) (string, error) {
	t.Helper()
	client, ctx, id := relayedClient(t, end)
	_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
	return id, err
}

// A review of the rule that reads a refusal naming another attempt without
// tollgate-spent as UNKNOWN (TestPlainMiddleRelayingARefusalIsUnknown)
// found a tollgate server that names an attempt it minted and sent no
// tollgate-spent: one that does not trust its caller and ignored its header
// as malformed (here a proxy in between repeats it). Its refusal was read as
// UNKNOWN, although the server answered for itself and ran nothing that
// could have taken effect. Such a server now reports tollgate-spent 0 (the
// caller's grant is not used here, as for an untrusted well-formed header),
// and the refusal stays NOT_ADMITTED.
func TestUntrustedCalleeIgnoringAMalformedHeaderRefusalStaysNotAdmitted(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return nil, queueFull()
	}}
	repeatHeader := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if vs := md.Get("tollgate"); len(vs) == 1 {
			md.Append("tollgate", vs[0]) // a repeated header is malformed (DESIGN.md §2.1)
		}
		return handler(metadata.NewIncomingContext(ctx, md), req)
	})
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, append([]grpc.ServerOption{repeatHeader}, untrustingServerOpts()...)...)
	id, err := relayedApply(t, end)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.NotEqual(t, id, o.Detail.GetAttemptId(), "precondition: the callee refused under an attempt it minted")
	require.Equal(t, int64(2), runs.Load(), "a refusal without effect is repeated")
}

// The paths by which a tollgate server refuses a caller it does not trust
// before any handler runs, each checked to stay NOT_ADMITTED under the rule
// of TestPlainMiddleRelayingARefusalIsUnknown: admission's refusal (a
// closed controller: DRAINING) at the tap the interceptor installs, and at
// AdmissionTap on a server without the interceptor. Both name the caller's
// own try.
func TestUntrustedCalleesAdmissionRefusalStaysNotAdmitted(t *testing.T) {
	untrusted := interceptor.WithTrustedPeer(func(context.Context) bool { return false })
	closed := func(t *testing.T) *admission.Controller {
		ctrl, err := admission.New()
		require.NoError(t, err)
		require.NoError(t, ctrl.Close())
		return ctrl
	}
	var runs atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return &testingv1.ApplyResponse{}, nil
	}}
	for name, opts := range map[string]func(t *testing.T) []grpc.ServerOption{
		"interceptor": func(t *testing.T) []grpc.ServerOption {
			return interceptor.ServerOptions(untrusted, interceptor.WithClockSkew(0), interceptor.WithAdmission(closed(t)))
		},
		"tap only": func(t *testing.T) []grpc.ServerOption {
			return []grpc.ServerOption{grpc.InTapHandle(interceptor.AdmissionTap(closed(t), untrusted))}
		},
	} {
		t.Run(name, func(t *testing.T) {
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, opts(t)...)
			_, err := relayedApply(t, end)
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.Equal(t, status.ReasonDraining, o.Reason, "%v", err)
		})
	}
	require.Zero(t, runs.Load())
}

// The stream form of TestUntrustedCalleesRefusalStaysNotAdmitted: a
// server-streaming handler at a tollgate server that does not trust its
// caller refuses without effect before sending anything, under the attempt
// the server minted; the refusal stays NOT_ADMITTED and is repeated.
func TestUntrustedCalleesStreamRefusalStaysNotAdmitted(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		runs.Add(1)
		return queueFull()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, untrustingServerOpts()...)
	client, ctx, id := relayedClient(t, end)
	st, err := client.Watch(ctx, &testingv1.WatchRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.NotEqual(t, id, o.Detail.GetAttemptId(), "precondition: the callee refused under an attempt it minted")
	require.Equal(t, int64(2), runs.Load(), "a refusal without effect is repeated")
}

// fastClient dials end with a tollgate client allowed tries tries with 1 ms
// backoffs and no retry budget, and any further options.
func fastClient(t *testing.T, end *testsvc.Endpoint, tries int, opts ...interceptor.ClientOption) testingv1.TestServiceClient {
	t.Helper()
	opts = append(opts, interceptor.WithoutRetryBudget(), fastRetry(tries))
	return testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(opts...)...))
}

// untrustingServerOpts are the tollgate server options of a server that
// trusts no caller, with no clock skew.
func untrustingServerOpts() []grpc.ServerOption {
	return interceptor.ServerOptions(
		interceptor.WithTrustedPeer(func(context.Context) bool { return false }),
		interceptor.WithClockSkew(0))
}

// queueFull is a refusal without effect, as a callee's admission returns it.
func queueFull() error {
	return status.WithoutEffect(status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond)))
}

// drainChat reads st until its client closes it, and ends the stream OK.
func drainChat(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
	for {
		if _, err := st.Recv(); err != nil {
			return nil
		}
	}
}

// chatOnce opens a Chat under ctx, sends one message, closes its side and
// returns the error of the first Recv. A try that ends at once may end
// before the message is sent: Send then decides the stream, which may end
// it (io.EOF, as grpc-go's, says so), and Recv returns how it ended.
func chatOnce(t *testing.T, ctx context.Context, client testingv1.TestServiceClient) error {
	t.Helper()
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	if err := st.Send(&testingv1.ChatRequest{}); err != io.EOF {
		require.NoError(t, err)
	}
	require.NoError(t, st.CloseSend())
	_, err = st.Recv()
	return err
}

// verifyAtStoreless is the Apply handling of a verifying-try test: try 1
// reaches the store backend, which runs and records it, and its answer is
// lost; every later try (the verifying try) reaches the store-less backend,
// which runs it (counted in effects) and answers OK.
func verifyAtStoreless(ctx context.Context, req any, handler grpc.UnaryHandler, tries, effects *atomic.Int64) (any, error) {
	switch tries.Add(1) {
	case 1: // the store backend runs and records it; the answer is lost
		_, _ = handler(ctx, req)
		return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
	default: // the verifying try reaches the store-less backend
		effects.Add(1)
		return &testingv1.ApplyResponse{}, nil
	}
}

// lateMark is the mark of the TestMarkBefore*IsHeeded tests, which comes
// after the store backend's query answered and before the verifying try, or
// the repeat after a fence, is sent: query 1 (answer) reaches the store backend and arms
// the client clock (dial), or the test arms it later; the clock's next read makes a warm-up Apply
// ("warm") whose query, query 2, the store-less backend answers
// UNIMPLEMENTED, marking the target recordless.
type lateMark struct {
	queries atomic.Int64
	armed   atomic.Bool
	cli     testingv1.TestServiceClient
}

// answer answers a FenceAttempt as the backend it reaches: query 2 the
// store-less backend (UNIMPLEMENTED), every other the store backend, which
// finds the record SUCCEEDED or fences the try, and then arms the client
// clock when arm is set (else the test arms it itself, later).
func (m *lateMark) answer(ctx context.Context, req any, handler grpc.UnaryHandler, arm bool) (any, error) {
	if m.queries.Add(1) == 2 {
		return nil, grpcstatus.Error(codes.Unimplemented, "no records") // the store-less backend
	}
	rec, err := handler(ctx, req)
	if arm {
		m.armed.Store(true)
	}
	return rec, err
}

// server starts the recorded server (a memory store) of a
// TestMarkBefore*IsHeeded test serving svc, behind an outer unary
// interceptor at which a FenceAttempt is answered as answer does (arming
// the clock when armOnFence is set), the warm-up call's Apply ("warm")
// fails UNAVAILABLE, its answer lost, so that its owner queries, and every
// other Apply goes to apply (nil: to the handler); stream, when not nil, is
// the outer stream interceptor.
func (m *lateMark) server(t *testing.T, svc *testsvc.Service, armOnFence bool,
	apply func(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error),
	stream grpc.StreamServerInterceptor) *testsvc.Endpoint {
	t.Helper()
	outer := []grpc.ServerOption{grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch info.FullMethod {
		case tollgatev1.AttemptService_FenceAttempt_FullMethodName:
			return m.answer(ctx, req, handler, armOnFence)
		case testingv1.TestService_Apply_FullMethodName:
			if req.(*testingv1.ApplyRequest).GetKey() == "warm" {
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset") // the warm-up call's try
			}
			if apply != nil {
				return apply(ctx, req, handler)
			}
		}
		return handler(ctx, req)
	})}
	if stream != nil {
		outer = append(outer, grpc.ChainStreamInterceptor(stream))
	}
	return recordedServer(t, svc, memoryStore(t), outer...)
}

// lateMarkService is the service of a TestMarkBefore*IsHeeded test: its
// Apply and Chat handlers count each run in effects; Apply answers OK, and
// Chat reads its stream to the end (drainChat).
func lateMarkService(effects *atomic.Int64) *testsvc.Service {
	return &testsvc.Service{
		ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			effects.Add(1)
			return &testingv1.ApplyResponse{}, nil
		},
		ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
			effects.Add(1)
			return drainChat(st)
		},
	}
}

// requireHeeded requires the end of a TestMarkBefore*IsHeeded call that
// ended with err: two queries (the call's own, and the warm-up call's that
// marked the target recordless; precondition says what they show), the
// handler run once (why says why), and the call UNKNOWN, naming its
// attempt. tries is the count of the call's tries, logged.
func (m *lateMark) requireHeeded(t *testing.T, err error, tries, effects *atomic.Int64, precondition, why string) {
	t.Helper()
	t.Logf("queries %d, tries %d, err %v", m.queries.Load(), tries.Load(), err)
	require.Equal(t, int64(2), m.queries.Load(), "precondition: "+precondition)
	require.Equal(t, int64(1), effects.Load(), why)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "the answer names the attempt")
}

// clock is the client clock of a TestMarkBefore*IsHeeded test: once armed,
// its next read makes the warm-up call (m.cli), whose query marks the
// target recordless.
func (m *lateMark) clock(t *testing.T) func() time.Time {
	return func() time.Time {
		if m.armed.CompareAndSwap(true, false) {
			// Another call's query marks the target recordless.
			_, werr := m.cli.Apply(context.Background(), &testingv1.ApplyRequest{Key: "warm"})
			require.Equal(t, status.KindUnknown, status.OutcomeOf(werr).Kind, "precondition: %v", werr)
		}
		return time.Now()
	}
}

// dial dials end with a client allowed three tries whose clock, once
// armed, makes the warm-up call, and returns that client.
func (m *lateMark) dial(t *testing.T, end *testsvc.Endpoint) testingv1.TestServiceClient {
	t.Helper()
	m.cli = fastClient(t, end, 3, interceptor.WithClientClock(m.clock(t)))
	return m.cli
}

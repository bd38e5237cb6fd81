package interceptor_test

import (
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/header"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestVerifyingTryAfterInProgressDoesNotCount: a call keyed
// explicitly (a ballot across runs of the calling handler) meets
// ATTEMPT_IN_PROGRESS — another run's try of the same key is running — and
// polls until the record finishes SUCCEEDED. Because the key is explicit,
// the owner does not replay the polled record but sends a verifying try
// (owner.go resolve sets w.verify). On the UNKNOWN path the first verifying
// try of a call does not count against the policy's tries (decide:
// uncounted = w.verify && !w.verified), and owner.verify's doc says so of
// "the first such try of a call"; on the ATTEMPT_IN_PROGRESS path decide
// ignores w.verify, so the verifying try counts. Under MaxTries 1 (a layer
// that allows one try) proceed then stops, and the call ends UNKNOWN
// although its record says SUCCEEDED and one uncounted try would have
// returned the stored response.
//
// Expected: OK with the stored response (total 1), the handler run once.
func TestVerifyingTryAfterInProgressDoesNotCount(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ledger := newLedger(func(context.Context, *testingv1.ApplyRequest) {
		close(entered)
		<-release // the first run's try is IN_PROGRESS until the query came
	})
	// Outermost: once the second call's owner queried the record (and was
	// answered IN_PROGRESS), the first run's try finishes.
	onFence := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if info.FullMethod == "/tollgate.v1.AttemptService/FenceAttempt" {
			once.Do(func() { close(release) })
		}
		return resp, err
	}
	end := recordedServer(t, &ledger.Service, memoryStore(t), grpc.ChainUnaryInterceptor(onFence))
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}),
		interceptor.WithoutRetryBudget())...)
	client := testingv1.NewTestServiceClient(conn)

	ctx, err := interceptor.StartAttempt(t.Context(), 3, 10*time.Second)
	require.NoError(t, err)
	kctx := interceptor.WithCallKey(ctx, "pay")
	req := &testingv1.ApplyRequest{Key: "acct", Amount: 1}

	first := make(chan error, 1)
	go func() {
		_, err := client.Apply(kctx, req)
		first <- err
	}()
	<-entered

	// Another run of the same ballot: its first try finds the record running.
	resp, err := client.Apply(kctx, req)
	require.NoError(t, <-first)
	require.Equal(t, int64(1), ledger.effects.Load(), "the handler ran once")
	require.NoError(t, err, "the record finished SUCCEEDED, yet the call ended %v (reason %v): its verifying try counted against MaxTries 1",
		status.OutcomeOf(err).Kind, status.OutcomeOf(err).Reason)
	require.Equal(t, int64(1), resp.GetTotal())
}

// graceStore signals when a try's record is finished, and holds the first
// FenceAttempt until released (or until the query is cancelled).
type graceStore struct {
	*idempotency.MemoryStore
	finished chan struct{}
	entered  chan struct{}
	release  chan struct{}
}

func (s *graceStore) Finish(ctx context.Context, req idempotency.FinishRequest) error {
	err := s.MemoryStore.Finish(ctx, req)
	select {
	case s.finished <- struct{}{}:
	default:
	}
	return err
}

func (s *graceStore) Fence(ctx context.Context, key idempotency.Key, through uint32) (*tollgatev1.AttemptRecord, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.MemoryStore.Fence(ctx, key, through)
}

// DESIGN.md §3.1: resolution queries run "on a detached context with a
// bounded grace after the deadline". At the origin the attempt's deadline is
// the caller's context deadline (the usual way to set one), so the grace is
// exactly for the time after that context expired. owner.resolve cancels the
// query as soon as the caller's context ends for any reason — its deadline
// included — so a try that was resolvable a moment after the deadline ends
// UNKNOWN ("the caller stopped waiting"), the worst answer, although the
// caller never cancelled.
func TestQueryGraceAfterCallerDeadline(t *testing.T) {
	store := &graceStore{MemoryStore: memoryStore(t),
		finished: make(chan struct{}, 1), entered: make(chan struct{}, 1), release: make(chan struct{})}
	handlerRelease := make(chan struct{})
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		<-handlerRelease // slow, detached from the client's per-try timeout
		return &testingv1.ApplyResponse{Total: 42}, nil
	}}
	end := recordedServer(t, svc, store)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(time.Minute),
		interceptor.WithResolutionGrace(time.Minute),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1, PerTryTimeout: 200 * time.Millisecond}),
	)...))

	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	type result struct {
		resp *testingv1.ApplyResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
		done <- result{resp, err}
	}()

	<-store.entered       // the try timed out on the client; its resolution began
	close(handlerRelease) // the detached handler finishes: SUCCEEDED, response kept
	<-store.finished
	<-ctx.Done() // the attempt's deadline (the caller's context deadline) passes
	// Well inside the grace (1 min), the store answers.
	time.Sleep(300 * time.Millisecond)
	close(store.release)

	r := <-done
	require.NoError(t, r.err, "the query is exempt from the deadline for the grace: the stored response answers the call")
	require.Equal(t, int64(42), r.resp.GetTotal())
}

// WithResolutionGrace: "The grace also runs past the caller's context's
// deadline ... a call in doubt at its deadline may return up to the grace
// later." owner.resolve bounds its queries by the *attempt's* deadline plus
// the grace (qctx), and no longer by the caller's context's deadline at all
// (the AfterFunc only reacts to cancellation). A call whose context deadline
// is earlier than its attempt's — a call under StartAttempt with a per-call
// timeout, or a handler's downstream call with its own timeout — keeps
// polling an IN_PROGRESS record until the attempt's deadline + grace, far
// past its own deadline + grace.
func TestResolutionBoundedByCallersDeadlinePlusGrace(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		select { // runs detached until the attempt's deadline: IN_PROGRESS meanwhile
		case <-release:
		case <-ctx.Done():
		}
		return &testingv1.ApplyResponse{Total: 1}, nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	const grace = 300 * time.Millisecond
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithResolutionGrace(grace),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}),
	)...))

	actx, err := interceptor.StartAttempt(t.Context(), 4, 2*time.Minute)
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(actx, 300*time.Millisecond) // this call's own deadline
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := client.Apply(cctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
		done <- err
	}()
	<-cctx.Done()
	// deadline + grace is 300 ms from now; allow thirty times that.
	timer := time.NewTimer(30 * grace)
	defer timer.Stop()
	select {
	case err := <-done:
		require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	case <-timer.C:
		t.Fatalf("the call's context deadline passed %v ago and it is still resolving (grace %v): it waits for the attempt's deadline (2 min) + grace", 30*grace, grace)
	}
}

// gateCodec is the proto codec, except that its marshalling of a ChatRequest
// whose value starts with "gate" stops, the times listed in hold (1: the
// first such marshalling), until the matching channel is closed: it stands
// for a slow marshal (a large message) at a chosen point. reached[i] is
// closed when marshalling number hold[i] starts.
type gateCodec struct {
	n       atomic.Int32
	hold    []int32
	reached []chan struct{}
	release []chan struct{}
}

func newGateCodec(hold ...int32) *gateCodec {
	c := &gateCodec{hold: hold}
	for range hold {
		c.reached = append(c.reached, make(chan struct{}))
		c.release = append(c.release, make(chan struct{}))
	}
	return c
}

func (c *gateCodec) Marshal(v any) ([]byte, error) {
	if m, ok := v.(*testingv1.ChatRequest); ok && strings.HasPrefix(m.GetValue(), "gate") {
		k := c.n.Add(1)
		for i, h := range c.hold {
			if h == k {
				close(c.reached[i])
				<-c.release[i]
			}
		}
	}
	return proto.Marshal(v.(proto.Message))
}

func (*gateCodec) Unmarshal(data []byte, v any) error {
	return proto.Unmarshal(data, v.(proto.Message))
}
func (*gateCodec) Name() string { return "proto" }

func (c *gateCodec) open() {
	for _, r := range c.release {
		select {
		case <-r:
		default:
			close(r)
		}
	}
}

// Regression (review 81, commit 26e03d7): the stream CloseSend and Trailer
// act on (streamSide.cur) becomes a repeat's stream only once its replay
// goroutine finished, and no longer before the repeat can be observed to
// end. A repeat that ends (here with a definite error, final) while its
// replay is still under way ends the stream, and the caller's RecvMsg
// returns try 2's status, but Trailer then returns try 1's trailer: the
// status and the trailer the caller reads belong to different tries. Before
// the commit the replay was done before any try's end could be seen.
//
// Expected: after RecvMsg returned the stream's status, Trailer is the
// trailer of the try that gave it ("run"="1"). Observed: "run"="0".
func TestTrailerAfterEndIsTheLastTrys(t *testing.T) {
	rec := &recorder{}
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		run := rec.start()
		if run == 0 {
			for {
				if _, err := st.Recv(); err != nil {
					break
				}
			}
			st.SetTrailer(metadata.Pairs("run", "0"))
			return shed() // without effect: repeated
		}
		st.SetTrailer(metadata.Pairs("run", "1"))
		return grpcstatus.Error(codes.InvalidArgument, "no") // definite: the stream's result
	}}
	codec := newGateCodec(2) // the replay's marshalling of "gate" waits
	t.Cleanup(codec.open)
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(codec)))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{Value: "gate"}))
	require.NoError(t, st.CloseSend())
	_, err = st.Recv()
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
	require.Len(t, rec.all(), 2)
	tr := st.Trailer()
	codec.open()
	require.Equal(t, []string{"1"}, tr.Get("run"), "the trailer of the try whose status RecvMsg returned")
}

// Regression (review 81, commit 26e03d7): a local SendMsg error (a message
// over MaxCallSendMsgSize) is typed only when no repeat started while the
// send was under way. When the caller's RecvMsg repeats the stream in the
// meantime (try 1 refused without effect), the new try's replay already
// holds the oversized message; SendMsg then returns grpc-go's bare
// RESOURCE_EXHAUSTED (gen != cs.gen, the stream not yet done), although the
// stream goes on, replays the earlier messages to a handler, and fails
// again on the same message: the very bare code commit 26e03d7 set out to
// remove (DESIGN.md §2.5), and an error from SendMsg that is not the
// stream's status.
//
// Expected: SendMsg's error is tollgate-typed (UNKNOWN naming the attempt),
// as without the repeat. Observed: bare RESOURCE_EXHAUSTED, no detail.
func TestLocalSendErrorDuringRepeatIsTyped(t *testing.T) {
	rec := &recorder{}
	firstRead := make(chan struct{})
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		run := rec.start()
		for {
			m, err := st.Recv()
			if err != nil {
				return err
			}
			rec.add(run, m.GetValue())
			if run == 0 {
				close(firstRead)
				return shed() // without effect: repeated
			}
		}
	}}
	// Marshalling 2 is the caller's send of the oversized message (1 is
	// "gate-small"), 4 is the replay's of it (3: the replay's "gate-small").
	codec := newGateCodec(2, 4)
	t.Cleanup(codec.open)
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(codec), grpc.MaxCallSendMsgSize(1024)))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(ctx)

	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{Value: "gate-small"}))
	<-firstRead
	sent := make(chan error, 1)
	go func() { sent <- st.Send(&testingv1.ChatRequest{Value: "gate" + strings.Repeat("x", 4096)}) }()
	<-codec.reached[0] // the caller's send is marshalling the big message on try 1
	// Only now the receiver, which repeats the stream: a repeat started
	// earlier would make its replay's "gate-small" marshalling number 2.
	var wg sync.WaitGroup
	var recvErr error
	wg.Go(func() { // the caller's receiver: it repeats the stream
		for {
			if _, recvErr = st.Recv(); recvErr != nil {
				return
			}
		}
	})
	select {
	case <-codec.reached[1]: // try 2's replay reached it
	case <-time.After(5 * time.Second):
		t.Fatal("no repeat")
	}
	close(codec.release[0])
	sendErr := <-sent
	codec.open()
	wg.Wait()

	t.Logf("SendMsg: %v; RecvMsg: %v; runs: %v", sendErr, recvErr, rec.all())
	require.Error(t, sendErr)
	o := status.OutcomeOf(sendErr)
	require.NotEqual(t, codes.ResourceExhausted, grpcstatus.Code(sendErr), "an UNKNOWN is never RESOURCE_EXHAUSTED (DESIGN.md §2.5): %v", sendErr)
	require.NotNil(t, o.Detail, "typed, naming the attempt: %v", sendErr)
	require.Equal(t, a.ID, o.Detail.GetAttemptId())
}

// Regression (review 72): a repeat's replay runs inside the caller's RecvMsg
// while it holds the stream's lock (clientStream.settleLocked →
// tryFromLocked → replayLocked), so while it replays nobody reads the new
// try's responses. A bidi handler that answers each message as it reads it
// (an echo with a larger answer) stops reading once HTTP/2 flow control stops
// its answers; the replay then blocks in SendMsg, and the stream hangs until
// the attempt's deadline, though the caller receives on its own goroutine, as
// grpc.ClientStream allows, and the same exchange without tollgate (or
// without the repeat) completes. Flow-control windows are pinned to
// grpc-go's default so that the BDP estimator does not grow them.
//
// Expected: the repeat is transparent and the stream completes. Observed:
// the stream ends at the attempt's deadline with an error.
func TestReplayDoesNotBlockOnFlowControl(t *testing.T) {
	t.Run("control: no repeat", func(t *testing.T) { replayFlow(t, false) })
	t.Run("repeat", func(t *testing.T) { replayFlow(t, true) })
}

func replayFlow(t *testing.T, refuseFirst bool) {
	const (
		msgs    = 14
		reqSize = 16 << 10  // 224 KiB in all: under StreamReplayLimit
		resSize = 256 << 10 // each answer more than one window
		window  = 64 << 10  // grpc-go's default; pinned, so BDP is off
	)
	rec := &recorder{}
	answer := strings.Repeat("r", resSize)
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		run := rec.start()
		if !refuseFirst {
			run++
		}
		for {
			m, err := st.Recv()
			if err == io.EOF {
				if run == 0 {
					return shed()
				}
				return nil
			}
			if err != nil {
				return err
			}
			if run == 0 {
				rec.add(run, m.GetValue()[:2])
				if len(rec.all()[0]) == msgs {
					return shed() // refused, without effect, after reading everything
				}
				continue
			}
			if err := st.Send(&testingv1.ChatResponse{Value: answer}); err != nil {
				return err
			}
		}
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		append(serverOpts(), grpc.InitialWindowSize(window), grpc.InitialConnWindowSize(window))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithInitialWindowSize(window), grpc.WithInitialConnWindowSize(window))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	st, err := client.Chat(ctx)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var sendErr error
	wg.Go(func() {
		for i := range msgs {
			v := string(rune('a'+i)) + "-" + strings.Repeat("q", reqSize)
			if sendErr = st.Send(&testingv1.ChatRequest{Value: v}); sendErr != nil {
				return
			}
		}
		sendErr = st.CloseSend()
	})
	got := 0
	for {
		_, err := st.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "after %d answers", got)
		got++
	}
	wg.Wait()
	require.NoError(t, sendErr)
	require.Equal(t, msgs, got)
	want := 1
	if refuseFirst {
		want = 2
	}
	require.Len(t, rec.all(), want)
}

// TestVerifyingTriesOfAnExplicitKeyAreBounded: an owner of an
// explicitly keyed call whose try's answer is lost after commit resolves it
// SUCCEEDED and sends a verifying try, which "does not count against the
// tries" (owner.go decide: uncounted = w.verify). When the verifying try's
// answer is lost too (a middlebox or an outer server interceptor that fails
// every answer of this call after the handler), it is resolved SUCCEEDED
// again and another uncounted verifying try follows, and so on: MaxTries
// never bounds the loop, only the deadline, header.MaxTry or the retry
// budget. At the origin the allowance does not bound it either (its tries
// are not charged).
//
// Expected: at most MaxTries tries, plus at most one verifying try.
func TestVerifyingTriesOfAnExplicitKeyAreBounded(t *testing.T) {
	store := memoryStore(t)
	var arrivals atomic.Int64
	// Outermost: the handler (and tollgate's record) runs, the answer is lost.
	drop := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != testingv1.TestService_Apply_FullMethodName {
			return handler(ctx, req)
		}
		arrivals.Add(1)
		_, _ = handler(ctx, req)
		return nil, grpcstatus.Error(codes.Unavailable, "r75: answer lost after commit")
	}
	ledger := newLedger(nil)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(drop)}, serverOpts(interceptor.WithAttemptStore(store))...)...)
	const maxTries = 2
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: maxTries, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}),
		interceptor.WithoutRetryBudget())...)

	ctx, err := interceptor.StartAttempt(t.Context(), 3, 500*time.Millisecond)
	require.NoError(t, err)
	_, err = testingv1.NewTestServiceClient(conn).Apply(interceptor.WithCallKey(ctx, "pay"), &testingv1.ApplyRequest{Key: "acct", Amount: 1})

	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	require.Equal(t, int64(1), ledger.effects.Load(), "the effect ran once (records hold)")
	require.LessOrEqual(t, arrivals.Load(), int64(maxTries+1),
		"MaxTries %d, but %d tries of one call reached the server", maxTries, arrivals.Load())
}

// A review found that an explicitly keyed server-streaming call whose request is
// fingerprinted (Consume) and whose answer is lost is resolved with
// FenceAttempt, which carries no request. owner.resolve (owner.go:428) sends
// a verifying try for an explicit key only for unary calls; a stream takes
// the record at its word. When the record is another request's (an earlier
// call, or an earlier run of the calling handler, under the same key), the
// stream reports that record's outcome as its own: COMMITTED ("the effect
// took place") for a request that never ran, or the other request's
// definite error. The server itself refuses that request as
// ATTEMPT_REQUEST_MISMATCH (TestExplicitKeyServerStreamWithAnotherRequestIsAMismatch):
// DESIGN.md §2.2, "a mismatch is refused, never replayed wrongly".
func TestClientExplicitStreamLostMismatchIsNotAnsweredFromTheRecord(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first *testingv1.ConsumeRequest
	}{
		{"record succeeded", &testingv1.ConsumeRequest{Key: "k", Count: 2}},
		{"record failed", &testingv1.ConsumeRequest{Key: "missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConsumer()
			store := memoryStore(t)
			// A proxy in front of the server loses the answer of the second
			// Consume (it says INTERNAL instead).
			var consumes atomic.Int64
			lose := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if info.FullMethod != consumeMethod || consumes.Add(1) != 2 {
					return h(srv, ss)
				}
				_ = h(srv, ss)
				return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
			})
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				testingv1.RegisterTestServiceServer(s, c)
				tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
			}, append([]grpc.ServerOption{lose}, serverOpts(interceptor.WithAttemptStore(store))...)...)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
			actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)
			ctx := interceptor.WithCallKey(actx, "feed")

			st, err := client.Consume(ctx, tc.first)
			require.NoError(t, err)
			_, _ = recvConsumed(st)
			require.Equal(t, int64(1), c.runs.Load())

			// Another request under the same key: the server refuses it as a
			// mismatch, but the proxy loses that answer.
			st, err = client.Consume(ctx, &testingv1.ConsumeRequest{Key: "k", Count: 3})
			require.NoError(t, err)
			got, err := recvConsumed(st)
			require.Empty(t, got)
			require.Equal(t, int64(1), c.runs.Load(), "the handler never ran for the second request")
			o := status.OutcomeOf(err)
			require.NotEqual(t, status.KindCommitted, o.Kind, "the second request never ran, yet: %v", err)
			require.False(t, o.Kind == status.KindFailed && o.Reason != status.ReasonAttemptRequestMismatch,
				"the first request's definite error is not the second's: %v", err)
			require.Equal(t, status.ReasonAttemptRequestMismatch, o.Reason,
				"a verifying try (as for unary calls) learns the mismatch; got %v", err)
		})
	}
}

// A review found that (DESIGN.md §3.3) a held grant moves to spent and free only from a record
// finished as SUCCEEDED, FAILED, FENCED or UNKNOWN — never IN_PROGRESS or
// ABANDONED. The owner decides by the record's finished_at, not its state:
// an ABANDONED (or IN_PROGRESS) answer that carries finished_at (an
// AttemptService or store of another make) refunds the held grant.
func TestAbandonedRecordDoesNotReconcile(t *testing.T) {
	for _, st := range []tollgatev1.AttemptState{
		tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED,
	} {
		t.Run(st.String(), func(t *testing.T) {
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return nil, grpcstatus.Error(codes.Internal, "effect done, then failed")
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				svc.Register(s)
				tollgatev1.RegisterAttemptServiceServer(s, wrongAnswers{answer: func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
					return &tollgatev1.AttemptRecord{AttemptId: r.GetAttemptId(), Call: r.GetCall(), Method: r.GetMethod(),
						State: st, Try: r.GetFenceThroughTry(), FinishedAt: timestamppb.Now()}
				}})
			})
			c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
			ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
			require.NoError(t, err)
			_, err = c.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
			require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
			a, _ := budget.FromContext(ctx)
			snap := a.Snapshot()
			require.Equal(t, int64(4), snap.Held+snap.Spent,
				"an %v record moved the held grant back to free: %+v", st, snap)
		})
	}
}

// A review found that a FAILED record's code was passed through as it was:
// an AttemptService of another make that keeps a FAILED record with
// UNAVAILABLE ended the call with a bare UNAVAILABLE, which generic retry
// policies repeat, and which DESIGN.md §2.5 rules out for an outcome in
// doubt. A FAILED record whose code is not definite now ends the call
// UNKNOWN, naming the try; a definite one still ends it with that error.
func TestFailedRecordWithoutDefiniteCodeIsUnknown(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		kind status.Kind
	}{{codes.Unavailable, status.KindUnknown}, {codes.NotFound, status.KindFailed}} {
		t.Run(tc.code.String(), func(t *testing.T) {
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return nil, grpcstatus.Error(codes.Internal, "effect done, then failed")
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				svc.Register(s)
				tollgatev1.RegisterAttemptServiceServer(s, wrongAnswers{answer: func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
					return &tollgatev1.AttemptRecord{AttemptId: r.GetAttemptId(), Call: r.GetCall(), Method: r.GetMethod(),
						State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, Try: r.GetFenceThroughTry(),
						StatusCode: int32(tc.code), StatusMessage: "as the record says"}
				}})
			})
			c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
			_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			o := status.OutcomeOf(err)
			require.Equal(t, tc.kind, o.Kind, "%v", err)
			if tc.kind == status.KindUnknown {
				require.NotEqual(t, codes.Unavailable, grpcstatus.Code(err), "never a bare UNAVAILABLE")
				require.NotEmpty(t, o.Detail.GetAttemptId())
			} else {
				require.Equal(t, tc.code, grpcstatus.Code(err))
			}
		})
	}
}

// A review found that resolution queries carried the call's own size
// limits (grpc.MaxCallRecvMsgSize, MaxCallSendMsgSize), though an
// AttemptRecord wraps the stored response with the attempt ID, call,
// method, timestamps and status, so it is always larger than the response.
// A response that fits the caller's limit (900 of 1024 bytes), whose answer
// was lost after the commit, is stored SUCCEEDED; the query for it was
// refused by the client's own receive limit, and the call ended UNKNOWN
// instead of returning the stored response. A stored response over the
// limit is still not handed over: the call ends COMMITTED.
func TestClientQuerySizeLimit(t *testing.T) {
	var effects, dropped atomic.Int64
	svc := &testsvc.Service{PutFunc: func(_ context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		effects.Add(1)
		return &testingv1.PutResponse{Value: r.GetValue()}, nil
	}}
	lose := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if info.FullMethod == testingv1.TestService_Put_FullMethodName && err == nil && dropped.Add(1) == 1 {
			return nil, grpcstatus.Error(codes.Unavailable, "connection reset after commit")
		}
		return resp, err
	})
	end := recordedServer(t, svc, memoryStore(t), lose)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	value := strings.Repeat("v", 900)
	resp, err := client.Put(t.Context(), &testingv1.PutRequest{Key: "k", Value: value}, grpc.MaxCallRecvMsgSize(1024))
	require.Equal(t, int64(1), effects.Load(), "never twice")
	require.NoError(t, err, "the stored response (%d bytes) fits the caller's 1024-byte limit", len(value)+3)
	require.Equal(t, value, resp.GetValue())
}

func TestClientQueryStoredResponseOverLimit(t *testing.T) {
	var effects atomic.Int64
	svc := &testsvc.Service{PutFunc: func(_ context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		effects.Add(1)
		return &testingv1.PutResponse{Value: r.GetValue()}, nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	// The response is over the caller's limit: grpc-go refuses it on the
	// try (client side), the owner resolves, and the record says SUCCEEDED.
	_, err := client.Put(t.Context(), &testingv1.PutRequest{Key: "k", Value: strings.Repeat("v", 2000)}, grpc.MaxCallRecvMsgSize(1024))
	require.Equal(t, int64(1), effects.Load(), "never twice")
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindCommitted, o.Kind, "the effect happened; the response over the limit is not handed over: %v", err)
}

// wrongAnswers is an AttemptService that answers FenceAttempt with a record
// of its answer function's making: a buggy or foreign implementation.
type wrongAnswers struct {
	tollgatev1.UnimplementedAttemptServiceServer
	answer func(*tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord
}

func (w wrongAnswers) FenceAttempt(_ context.Context, r *tollgatev1.FenceAttemptRequest) (*tollgatev1.AttemptRecord, error) {
	return w.answer(r), nil
}

// The owner repeats a try in doubt only on an answer to the question it
// asked: a FENCED record of another call, or a fence below the try in
// doubt, says nothing of that try, which may have run. Before, the owner
// trusted any FENCED answer and repeated (found by review, as hardening).
func TestAnswerForAnotherCallOrTryIsNotTrusted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(*tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord
	}{
		{"another call", func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
			return &tollgatev1.AttemptRecord{AttemptId: r.GetAttemptId(), Call: r.GetCall() + "x", Method: r.GetMethod(),
				State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, FencedThroughTry: r.GetFenceThroughTry()}
		}},
		{"another attempt", func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
			return &tollgatev1.AttemptRecord{AttemptId: "01a22bcd-4490-7a20-a651-a5fcfed10e60", Call: r.GetCall(), Method: r.GetMethod(),
				State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, FencedThroughTry: r.GetFenceThroughTry()}
		}},
		{"a fence below the try", func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
			return &tollgatev1.AttemptRecord{AttemptId: r.GetAttemptId(), Call: r.GetCall(), Method: r.GetMethod(),
				State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, FencedThroughTry: r.GetFenceThroughTry() - 1}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				runs.Add(1)
				return nil, grpcstatus.Error(codes.Internal, "effect done, then failed")
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				svc.Register(s)
				tollgatev1.RegisterAttemptServiceServer(s, wrongAnswers{answer: tc.answer})
			})
			c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
			_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			require.Equal(t, int32(1), runs.Load(), "a try in doubt was repeated on an answer about something else")
			require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
		})
	}
}

// The stream twin of TestResolutionQueryCarriesDefaultCallOptions: the
// stream owner's FenceAttempt carries no call options at all (queryOpts is
// never set for streams), so it is refused and a committed stream whose
// record is SUCCEEDED ends UNKNOWN instead of COMMITTED.
func TestStreamResolutionQueryCarriesCallOptions(t *testing.T) {
	var refused atomic.Bool
	auth := func(ctx context.Context) error {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("authorization")) == 0 {
			refused.Store(true)
			return grpcstatus.Error(codes.Unauthenticated, "no credentials")
		}
		return nil
	}
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		if _, err := st.Recv(); err != nil {
			return err
		}
		return st.Send(&testingv1.ChatResponse{})
	}}
	outer := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := auth(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := auth(ss.Context()); err != nil {
				return err
			}
			if err := h(srv, ss); err != nil {
				return err
			}
			return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
		}),
	}
	end := recordedServer(t, svc, memoryStore(t), outer...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithDefaultCallOptions(grpc.PerRPCCredentials(tokenCreds{})))...))
	st, err := client.Chat(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{}))
	_, err = st.Recv()
	require.NoError(t, err)
	_, err = st.Recv()
	o := status.OutcomeOf(err)
	require.False(t, refused.Load(), "the stream's FenceAttempt carries the call options: %v", err)
	require.Equal(t, status.KindCommitted, o.Kind, "%v", err)
}

// The stream twin of TestUnverifiableFirstTryRefundsItsGrant: the stream
// owner ends the call NOT_ADMITTED final but leaves try 1's grant held.
func TestUnverifiableFirstStreamTryRefundsItsGrant(t *testing.T) {
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	minted := time.Now()
	for time.Now().UnixMilli() <= minted.UnixMilli() {
		time.Sleep(time.Millisecond)
	}
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		return nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	_, err = st.Recv()
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
	require.True(t, o.Final())
	led, _ := budget.FromContext(ctx)
	snap := led.Snapshot()
	require.Zero(t, snap.Held, "a call that ended NOT_ADMITTED (no effect) keeps nothing held")
	require.Equal(t, int64(4), snap.Free)
}

// A bidi stream commits (a reply arrived), then its status is lost by a
// proxy. The record is SUCCEEDED: without a call key the stream ends
// COMMITTED; with an explicit key it ends UNKNOWN.
func TestExplicitKeyCommittedStream(t *testing.T) {
	for _, explicit := range []bool{false, true} {
		t.Run(map[bool]string{false: "per-run key", true: "explicit key"}[explicit], func(t *testing.T) {
			svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
				if _, err := st.Recv(); err != nil {
					return err
				}
				return st.Send(&testingv1.ChatResponse{})
			}}
			lose := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if err := h(srv, ss); err != nil {
					return err
				}
				return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
			})
			end := recordedServer(t, svc, memoryStore(t), lose)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
			ctx := context.Context(t.Context())
			if explicit {
				ctx = interceptor.WithCallKey(ctx, "chat-1")
			}
			st, err := client.Chat(ctx)
			require.NoError(t, err)
			require.NoError(t, st.Send(&testingv1.ChatRequest{}))
			_, err = st.Recv()
			require.NoError(t, err)
			_, err = st.Recv()
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindCommitted, o.Kind, "%v", err)
		})
	}
}

// A stream's record is stored SUCCEEDED with response_retained true and an
// empty response: an operator's GetAttempt is told a response was kept.
func TestStreamRecordClaimsRetainedResponse(t *testing.T) {
	svc := &testsvc.Service{UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		for {
			if _, err := st.Recv(); err == io.EOF {
				return st.SendAndClose(&testingv1.UploadResponse{Count: 7})
			} else if err != nil {
				return err
			}
		}
	}}
	end := recordedServer(t, svc, memoryStore(t))
	conn := end.DialT(t, interceptor.DialOptions()...)
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(ctx)
	st, err := testingv1.NewTestServiceClient(conn).Upload(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.UploadRequest{Value: "x"}))
	_, err = st.CloseAndRecv()
	require.NoError(t, err)
	rec, err := tollgatev1.NewAttemptServiceClient(conn).GetAttempt(t.Context(), &tollgatev1.GetAttemptRequest{
		AttemptId: a.ID, Call: "0", Method: testingv1.TestService_Upload_FullMethodName})
	require.NoError(t, err)
	t.Logf("state=%v retained=%v len(response)=%d", rec.GetState(), rec.GetResponseRetained(), len(rec.GetResponse()))
	require.False(t, rec.GetResponseRetained(), "a stream's response is never kept")
}

// highFence answers every fence with a tombstone through try 1000 (the
// header's last try), as a callee whose explicit key was fenced that far.
type highFence struct{ *idempotency.MemoryStore }

func (s highFence) Fence(ctx context.Context, key idempotency.Key, through uint32) (*tollgatev1.AttemptRecord, error) {
	return &tollgatev1.AttemptRecord{AttemptId: key.AttemptID, Call: key.Call, Method: key.Method,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, FencedThroughTry: 1000}, nil
}

func TestStreamFenceAtMaxTry(t *testing.T) {
	var tries atomic.Int32
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		tries.Add(1)
		return grpcstatus.Error(codes.Internal, "boom") // UNKNOWN, nothing sent
	}}
	end := recordedServer(t, svc, highFence{memoryStore(t)})
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAttemptTimeout(10*time.Second))...))
	st, err := client.Chat(t.Context())
	require.NoError(t, err)
	_, err = st.Recv()
	o := status.OutcomeOf(err)
	t.Logf("handler runs %d; stream result: kind %v reason %v: %v", tries.Load(), o.Kind, status.ReasonName(o.Reason), err)
	require.Equal(t, status.ReasonAttemptFenced, o.Reason, "as a unary call: the fence reached the last try the header can carry")
}

// Regression: an interceptor chained inside tollgate's (grpc.NewServer(
// interceptor.ServerOptions(...)..., grpc.ChainStreamInterceptor(audit)))
// runs only for a try whose record the store started, for a server-streaming
// call as for a unary one. When a server-streaming record was begun lazily,
// at the handler's first RecvMsg, such an interceptor's effect (here a
// downstream call with side effects) happened for a try the store then
// refused: the try was answered NOT_ADMITTED ATTEMPT_FENCED — "no effect at
// this tier or below" (DESIGN.md §3.6) — with tollgate-spent 1, and the
// effect repeated on the owner's next try.
//
// Each kind of call is sent as try 1 of a call the owner fenced through try
// 1, which the store refuses before anything inner runs, and then as try 2,
// which runs: the inner interceptor acts once, for try 2, and for a
// server-streaming call whose request tollgate received first it sees that
// request.
func TestInnerStreamInterceptorRunsOnlyForABegunTry(t *testing.T) {
	dep := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions()...))
	audit := func(ctx context.Context) error {
		_, err := depClient.Apply(ctx, &testingv1.ApplyRequest{})
		return err
	}
	var (
		mu       sync.Mutex
		received []string // request keys the inner stream interceptor saw
	)
	inner := []grpc.ServerOption{
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := audit(ss.Context()); err != nil {
				return err
			}
			return h(srv, &observed{ServerStream: ss, seen: func(key string) {
				mu.Lock()
				received = append(received, key)
				mu.Unlock()
			}})
		}),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := audit(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
	}
	c := newConsumer()
	c.ApplyFunc = func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}
	store := memoryStore(t)
	end := startRecorded(t, c, store, nil, inner...)
	conn := end.DialT(t)
	w, a := newRawOwner(t, conn)
	w.units = 2

	for i, tc := range []struct {
		name   string
		method string
		call   func(ctx context.Context) (metadata.MD, error)
		runs   func() int64
		seen   []string // what the inner stream interceptor received
	}{
		{"unary", testingv1.TestService_Apply_FullMethodName, func(ctx context.Context) (metadata.MD, error) {
			var tr metadata.MD
			err := conn.Invoke(ctx, testingv1.TestService_Apply_FullMethodName, &testingv1.ApplyRequest{}, &testingv1.ApplyResponse{}, grpc.Trailer(&tr))
			return tr, err
		}, func() int64 { return c.Calls("Apply") }, nil},
		{"server stream, request received first", consumeMethod, func(ctx context.Context) (metadata.MD, error) {
			st, err := testingv1.NewTestServiceClient(conn).Consume(ctx, &testingv1.ConsumeRequest{Key: "consumed", Count: 1})
			if err != nil {
				return nil, err
			}
			_, err = recvConsumed(st)
			return st.Trailer(), err
		}, c.runs.Load, []string{"consumed"}},
		{"server stream, request type unknown", recordedWatch, func(ctx context.Context) (metadata.MD, error) {
			st, err := watchRecorded(ctx, conn, &testingv1.WatchRequest{Key: "watched", Count: 1})
			if err != nil {
				return nil, err
			}
			_, err = recvAll(st)
			return st.Trailer(), err
		}, func() int64 { return c.Calls("Watch") }, []string{"watched"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			received = nil
			mu.Unlock()
			call := "audited-" + strconv.Itoa(i)
			key := idempotency.Key{Tenant: "t1", AttemptID: a.ID, Call: call, Method: tc.method}
			_, err := store.Fence(t.Context(), key, 1)
			require.NoError(t, err)
			audits, runs := dep.Calls("Apply"), tc.runs()

			tr, err := tc.call(w.ctx(t.Context(), call, 1))
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.Equal(t, status.ReasonAttemptFenced, o.Reason, "%v", err)
			require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"), "the refused try spent nothing")
			require.Equal(t, audits, dep.Calls("Apply"), "the inner interceptor acted for a try answered NOT_ADMITTED")
			require.Equal(t, runs, tc.runs())

			tr, err = tc.call(w.ctx(t.Context(), call, 2))
			require.NoError(t, err)
			require.Equal(t, []string{"1"}, tr.Get("tollgate-spent"), "the inner interceptor's call is this try's")
			require.Equal(t, audits+1, dep.Calls("Apply"), "the inner interceptor acts for the try that runs")
			require.Equal(t, runs+1, tc.runs())
			mu.Lock()
			require.Equal(t, tc.seen, received)
			mu.Unlock()
			rec, err := store.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
			require.Equal(t, uint32(2), rec.GetTry())
		})
	}
}

// observed is a stream interceptor's stream that reports the key of each
// request its handler receives.
type observed struct {
	grpc.ServerStream
	seen func(key string)
}

func (o *observed) RecvMsg(m any) error {
	if err := o.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if r, ok := m.(interface{ GetKey() string }); ok {
		o.seen(r.GetKey())
	}
	return nil
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A handler whose own call ended NOT_ADMITTED ATTEMPT_FENCED (its owner
// resolved the try in doubt as fenced: no try ran) and that returns it
// wrapped with status.WithoutEffect has declared that nothing happened
// (DESIGN.md §3.6: such a refusal stays NOT_ADMITTED). The server
// re-addresses the refusal to its own call but keeps the reason
// ATTEMPT_FENCED, with fenced_through_try 0; the caller's owner reads
// ATTEMPT_FENCED as "my call is in doubt" and ends the call UNKNOWN,
// although the callee proved it had no effect.
func TestReaddressedFencedStaysNotAdmitted(t *testing.T) {
	// dep: not a tollgate server. Its Apply is refused before the handler
	// runs, with a status that carries no detail (its owner cannot tell it
	// from a try that ran); its AttemptService honestly answers FENCED.
	depSvc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		t.Error("dep's handler must not run")
		return &testingv1.ApplyResponse{}, nil
	}}
	refuse := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == testingv1.TestService_Apply_FullMethodName {
			return nil, grpcstatus.Error(codes.Internal, "dep: refused before running")
		}
		return h(ctx, req)
	}
	dep := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		depSvc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, wrongAnswers{answer: func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
			return &tollgatev1.AttemptRecord{AttemptId: r.GetAttemptId(), Call: r.GetCall(), Method: r.GetMethod(),
				State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, FencedThroughTry: r.GetFenceThroughTry()}
		}})
	}, grpc.UnaryInterceptor(refuse))
	toDep := testingv1.NewTestServiceClient(dep.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	midErrs := make(chan error, 1)
	midSvc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		_, err := toDep.Apply(ctx, r)
		midErrs <- err
		if status.OutcomeOf(err).Kind == status.KindNotAdmitted {
			return nil, status.WithoutEffect(err) // nothing happened here or below
		}
		return nil, err
	}}
	mid := testsvc.StartT(t, testsvc.Bufconn, midSvc.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(mid.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	_, err := origin.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	midErr := <-midErrs
	mo := status.OutcomeOf(midErr)
	require.Equal(t, status.KindNotAdmitted, mo.Kind, "precondition: mid's call ended NOT_ADMITTED: %v", midErr)
	require.Equal(t, status.ReasonAttemptFenced, mo.Reason, "precondition: %v", midErr)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind,
		"mid declared its refusal without effect, yet the origin's call ended %v: %v", o.Kind, err)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestFenceThroughMaxTryEndsTheCall: an explicitly keyed call is fenced
// through the last try the header can carry (another run of its handler
// fenced the key through header.MaxTry). Before 5377d5d the owner capped
// the fence at MaxTry-1, saw it did not cover try MaxTry, and ended. Now a
// refusal of try MaxTry fenced through MaxTry jumps to min(f, MaxTry-1)+1
// = MaxTry: the owner sends the same fenced try again and again, each
// repeat uncounted (a ballot jump), until the deadline. A try number must
// never be sent twice by its owner.
func TestFenceThroughMaxTryEndsTheCall(t *testing.T) {
	var mu sync.Mutex
	seen := map[uint32]int{}
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		h, err := header.ParseValues(md.Get("tollgate"))
		require.NoError(t, err)
		mu.Lock()
		seen[h.Try]++
		mu.Unlock()
		return nil, status.NotAdmitted(status.ReasonAttemptFenced, status.Fields{
			AttemptID: h.Attempt, Call: h.Call, Try: h.Try, FencedThroughTry: header.MaxTry})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		fastRetry(3),
		interceptor.WithoutRetryBudget(),
		interceptor.WithAttemptTimeout(time.Second))...))
	_, err := client.Get(interceptor.WithCallKey(t.Context(), "reserve"), &testingv1.GetRequest{})
	require.Error(t, err)
	mu.Lock()
	defer mu.Unlock()
	for try, n := range seen {
		require.Equal(t, 1, n, "try %d was sent %d times (tries seen: %v)", try, n, len(seen))
	}
}

// fencedThroughMaxTry answers every try of a call keyed "reserve" with
// ATTEMPT_FENCED through header.MaxTry (another run of the handler fenced
// the key through the last try), and every other call QUEUE_FULL on its
// first try, OK on its second.
func fencedThroughMaxTry(t *testing.T, sent *atomic.Int32) *testsvc.Service {
	return &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		h, err := header.ParseValues(md.Get("tollgate"))
		require.NoError(t, err)
		if h.Call == "reserve" {
			sent.Add(1)
			return nil, status.NotAdmitted(status.ReasonAttemptFenced, status.Fields{
				AttemptID: h.Attempt, Call: h.Call, Try: h.Try, FencedThroughTry: header.MaxTry})
		}
		if h.Try == 1 {
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.Fields{
				AttemptID: h.Attempt, Call: h.Call, Try: h.Try})
		}
		return &testingv1.GetResponse{}, nil
	}}
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestFixes2FenceJumpPastMaxTrySpendsNoRetryToken: a unary call whose try 1
// is fenced through header.MaxTry jumps to MaxTry+1, which the header cannot
// carry, so the call ends without sending another try. owner.run checks
// n > MaxTry only at the top of its loop, after proceed withdrew a
// retry-budget token (and slept a backoff) for that try; the token is never
// returned (unprepared returns it for a try prepare refuses, this path does
// not). The stream owner checks n+1 > MaxTry before proceed. The budget
// bounds retries sent (README, owner.unprepared): a repeat never sent must
// not spend its token. Here the budget holds exactly one token and earns
// none; the next call's single legitimate retry is refused.
func TestFenceJumpPastMaxTrySpendsNoRetryToken(t *testing.T) {
	var sent atomic.Int32
	end := testsvc.StartT(t, testsvc.Bufconn, fencedThroughMaxTry(t, &sent).Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		fastRetry(3),
		interceptor.WithRetryBudget(budget.WithMaxRetryTokens(1), budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0)),
		interceptor.WithAttemptTimeout(5*time.Second))...))

	_, err := client.Get(interceptor.WithCallKey(t.Context(), "reserve"), &testingv1.GetRequest{})
	require.Error(t, err)
	require.EqualValues(t, 1, sent.Load(), "one try of the fenced call was sent")

	// One retry, the budget's one token: it must still be there.
	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err, "the fenced call sent no repeat, yet the retry budget's token is gone")
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestFixes2FenceJumpPastMaxTrySpanTry: the call span's tollgate.try is
// "the last try sent; a repeat refused before it left is not one"
// (interceptor/doc.go). A unary call that sent try 1 and was fenced through
// MaxTry returns n-1 = MaxTry from owner.run, so the span reports try 1000
// for a call that sent one try (the stream owner reports cs.n).
func TestFenceJumpPastMaxTrySpanTry(t *testing.T) {
	tp, spans := testTracer(t)
	var sent atomic.Int32
	end := testsvc.StartT(t, testsvc.Bufconn, fencedThroughMaxTry(t, &sent).Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		fastRetry(3),
		interceptor.WithoutRetryBudget(),
		interceptor.WithClientTracerProvider(tp),
		interceptor.WithAttemptTimeout(5*time.Second))...))

	_, err := client.Get(interceptor.WithCallKey(t.Context(), "reserve"), &testingv1.GetRequest{})
	require.Error(t, err)
	require.EqualValues(t, 1, sent.Load())
	var calls int
	for _, s := range spans.GetSpans() {
		if s.Name != "tollgate.call" {
			continue
		}
		calls++
		try, _ := attr(s.Attributes, "tollgate.try")
		require.EqualValues(t, 1, try.AsInt64(), "the call span reports a try that was never sent")
	}
	require.Equal(t, 1, calls)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestFixes2FenceJumpRefusedSpanTry: try 1 of an explicitly keyed call is
// fenced through try 4 (another run of the handler holds the ballot); the
// owner would jump to try 5, but the retry budget refuses that repeat. No
// try but 1 was sent, yet owner.run returns n = next-1 = 4 from proceed's
// refusal, and the call span reports tollgate.try 4, a try never sent
// (doc.go: "try (the last try sent; a repeat refused before it left is not
// one)"). The stream owner reports cs.n.
func TestFenceJumpRefusedSpanTry(t *testing.T) {
	tp, spans := testTracer(t)
	var sent atomic.Int32
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		h, err := header.ParseValues(md.Get("tollgate"))
		require.NoError(t, err)
		if h.Call == "reserve" {
			sent.Add(1)
			return nil, status.NotAdmitted(status.ReasonAttemptFenced, status.Fields{
				AttemptID: h.Attempt, Call: h.Call, Try: h.Try, FencedThroughTry: 4})
		}
		if h.Try == 1 {
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.Fields{AttemptID: h.Attempt, Call: h.Call, Try: h.Try})
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		fastRetry(3),
		interceptor.WithRetryBudget(budget.WithMaxRetryTokens(1), budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0)),
		interceptor.WithClientTracerProvider(tp),
		interceptor.WithAttemptTimeout(5*time.Second))...))
	// Spend the budget's one token on a legitimate retry.
	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	spans.Reset()

	_, err = client.Get(interceptor.WithCallKey(t.Context(), "reserve"), &testingv1.GetRequest{})
	require.Error(t, err)
	require.EqualValues(t, 1, sent.Load(), "only try 1 was sent")
	var calls int
	for _, s := range spans.GetSpans() {
		if s.Name != "tollgate.call" {
			continue
		}
		calls++
		try, _ := attr(s.Attributes, "tollgate.try")
		require.EqualValues(t, 1, try.AsInt64(), "the call span reports a try that was never sent (error: %v)", err)
	}
	require.Equal(t, 1, calls)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestUnknownReplayKeepsDetails: a try whose handler ended with
// an error that is not definite (INTERNAL, carrying a google.rpc.DebugInfo)
// is answered UNKNOWN, and the UNKNOWN answer carries the handler's details
// after tollgate's own (status.OutcomeUnknown: "the cause's status details
// ... that still say something true of the call"). finishTry records those
// details in the UNKNOWN record (FinishRequest.Details), and the README's
// table says a finished record answers every later try with "that record
// ... the error repeated". server.replay rebuilds an UNKNOWN record's error
// from its code and message only (records.go replay, default case), so a
// later try of the same call gets an UNKNOWN without the handler's details:
// the same record answers differently depending on which try asks.
func TestUnknownReplayKeepsDetails(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		st, _ := grpcstatus.New(codes.Internal, "boom").WithDetails(&errdetails.DebugInfo{Detail: "ledger write timed out"})
		return nil, st.Err()
	}}
	end := recordedServer(t, svc, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t)) // raw gRPC: the test plays the owner
	id, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(id)
	send := func(try int64) error {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
			"a="+a.ID+";c=0;t="+itoa(try)+";d="+itoa(a.Deadline.UnixMilli()))
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
		return err
	}
	debugInfo := func(err error) string {
		for _, d := range grpcstatus.Convert(err).Details() {
			if di, ok := d.(*errdetails.DebugInfo); ok {
				return di.GetDetail()
			}
		}
		return ""
	}

	first := send(1)
	require.Equal(t, status.KindUnknown, status.OutcomeOf(first).Kind, "%v", first)
	require.Equal(t, "ledger write timed out", debugInfo(first), "the try that ran carries the handler's detail")

	replayed := send(2)
	require.Equal(t, status.KindUnknown, status.OutcomeOf(replayed).Kind, "%v", replayed)
	require.Equal(t, grpcstatus.Code(first), grpcstatus.Code(replayed))
	require.Equal(t, "ledger write timed out", debugInfo(replayed),
		"the UNKNOWN record's replay dropped the status details it keeps (%d details: %v)",
		len(grpcstatus.Convert(replayed).Details()), grpcstatus.Convert(replayed).Details())
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestVerifyingTryInTheGrace: DESIGN.md §3.1 gives resolution
// a grace after the deadline "because ... an unresolved UNKNOWN is the worst
// answer tollgate gives", and a record finished during it answers a
// numbered call with its stored response (checked first, below). Under an
// explicit key, owner.resolve turns the same SUCCEEDED record into a
// verifying try, which proceed/prepare treat as a repeat: past the
// attempt's deadline no try fits, and the call ends UNKNOWN although the
// record holds this request's response and the query that found it was
// still inside its grace. The client's clock is moved past the deadline
// (200 ms into the 1 s grace) once the owner queries; the server keeps real
// time.
func TestVerifyingTryInTheGrace(t *testing.T) {
	numberedAndExplicit(t, func(t *testing.T, explicit bool) {
		const timeout = 10 * time.Second
		var offset, deadline atomic.Int64
		clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
		queried := make(chan struct{})
		var once sync.Once
		ledger := newLedger(func(context.Context, *testingv1.ApplyRequest) { <-queried })
		onFence := beforeFence(func() {
			once.Do(func() {
				// The client now reads a time in the grace, however long
				// the try before the query took.
				offset.Store(int64(time.Until(time.Unix(0, deadline.Load())) + 200*time.Millisecond))
				close(queried)
			})
		})
		end := recordedServer(t, &ledger.Service, memoryStore(t), onFence)
		client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
			interceptor.WithClientClock(clock),
			shortTryRetry(),
			interceptor.WithoutRetryBudget())...))

		ctx, err := interceptor.StartAttempt(t.Context(), 0, timeout)
		require.NoError(t, err)
		a, _ := interceptor.AttemptFromContext(ctx)
		deadline.Store(a.Deadline.UnixNano())
		if explicit {
			ctx = interceptor.WithCallKey(ctx, "pay")
		}
		resp, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
		require.Equal(t, int64(1), ledger.effects.Load(), "the handler ran once")
		o := status.OutcomeOf(err)
		require.NoError(t, err, "the record finished SUCCEEDED inside the grace, yet the call ended %v (reason %v)",
			o.Kind, status.ReasonName(o.Reason))
		require.Equal(t, int64(7), resp.GetTotal())
	})
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestVerifyingTryAfterAllUnitsSpent: at the origin, a call
// keyed explicitly (WithCallKey) whose one try spent the attempt's whole
// allowance below (the callee's handler used its grant) and whose answer
// the client stopped waiting for (per-try timeout) is resolved: the owner
// fences, polls while IN_PROGRESS, and finds the record SUCCEEDED. Because
// the key is explicit, owner.resolve does not hand over the stored response
// but asks for a verifying try (the README's departure for §3.5: "one more
// try, uncounted, which the store checks against the record's
// fingerprint"). That try is answered from the record and needs no unit
// below, yet proceed asks unpayable (and prepare checks the ledger), which
// at the origin refuses any try n > 1 once every unit was spent: the call
// ends UNKNOWN (ALLOWANCE_EXHAUSTED in doubt) although its record holds this
// very request's SUCCEEDED response. The same call without WithCallKey
// returns the stored response (checked first, below).
//
// Expected: both calls return the stored response; the handler ran once
// per call.
func TestVerifyingTryAfterAllUnitsSpent(t *testing.T) {
	numberedAndExplicit(t, func(t *testing.T, explicit bool) {
		queried := make(chan struct{})
		var once sync.Once
		ledger := newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
			// The handler's downstream work spends its grant's one unit.
			a, ok := budget.FromContext(ctx)
			require.True(t, ok)
			require.NoError(t, a.Take())
			// It answers only once the owner, having given up waiting
			// for this try, is resolving it.
			<-queried
		})
		onFence := beforeFence(func() {
			once.Do(func() { close(queried) })
		})
		end := recordedServer(t, &ledger.Service, memoryStore(t), onFence)
		client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
			shortTryRetry(),
			interceptor.WithoutRetryBudget())...))

		ctx, err := interceptor.StartAttempt(t.Context(), 1, 10*time.Second)
		require.NoError(t, err)
		if explicit {
			ctx = interceptor.WithCallKey(ctx, "pay")
		}
		resp, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
		require.Equal(t, int64(1), ledger.effects.Load(), "the handler ran once")
		o := status.OutcomeOf(err)
		require.NoError(t, err, "the record is SUCCEEDED with this request's response, yet the call ended %v (reason %v)",
			o.Kind, status.ReasonName(o.Reason))
		require.Equal(t, int64(7), resp.GetTotal())
	})
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestRefusedRefundsUnwithdrawnToken: the verifying try skips
// proceed, so no retry-budget token is withdrawn for it; but when prepare
// refuses it (here: the resolution's grace is over when it is prepared),
// owner.unprepared gives a token back to the budget as if proceed had
// withdrawn one. The resolution's own token (spent on a query that was sent)
// is thereby refunded, and the budget no longer bounds resolutions: with a
// budget of one token and no refill, a second call's resolution still
// queries.
func TestRefusedRefundsUnwithdrawnToken(t *testing.T) {
	const timeout = 2 * time.Second
	const grace = 100 * time.Millisecond
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }

	var mu sync.Mutex
	var release chan struct{}
	var closed bool
	arm := func() {
		mu.Lock()
		release, closed = make(chan struct{}), false
		mu.Unlock()
		offset.Store(0)
	}
	fire := func() {
		mu.Lock()
		defer mu.Unlock()
		if !closed {
			closed = true
			close(release)
		}
	}
	var fences atomic.Int64
	ledger := newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
		mu.Lock()
		ch := release
		mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
	})
	onFence := beforeFence(func() {
		fences.Add(1)
		// The client now reads a time past the resolution's grace.
		offset.Store(int64(timeout + grace + time.Second))
		fire()
	})
	end := recordedServer(t, &ledger.Service, memoryStore(t), onFence)
	t.Cleanup(fire) // runs before the server stops: no handler is left waiting
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientClock(clock),
		interceptor.WithResolutionGrace(grace),
		shortTryRetry(),
		interceptor.WithRetryBudget(budget.WithMaxRetryTokens(1), budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0)))...))

	call := func() error {
		arm()
		ctx, err := interceptor.StartAttempt(t.Context(), 0, timeout)
		require.NoError(t, err)
		ctx = interceptor.WithCallKey(ctx, "pay")
		_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
		return err
	}

	err := call()
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	require.NotZero(t, fences.Load(), "the first call was resolved (its token: the budget's only one)")

	fire()
	fences.Store(0)
	err = call()
	require.Zero(t, fences.Load(),
		"the budget held one token and never refills, and the first call's resolution spent it; "+
			"yet the second call's resolution queried too (its result: %v)", err)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestTryHasRetryEvent: doc.go's Observability says the
// call span records tollgate.retry for "the repeat about to be sent, recorded
// once it passed the local checks". The verifying try after a resolution
// under a WithCallKey key is try 2, sent (its tollgate.allowance.spend event
// is there, the span reports try 2), but since it skips proceed, w.retrying
// is never set and prepared records no tollgate.retry event for it (before
// 1783850 it had one).
func TestTryHasRetryEvent(t *testing.T) {
	tp, spans := testTracer(t)

	queried := make(chan struct{})
	var once sync.Once
	ledger := newLedger(func(context.Context, *testingv1.ApplyRequest) { <-queried })
	onFence := beforeFence(func() {
		once.Do(func() { close(queried) })
	})
	end := recordedServer(t, &ledger.Service, memoryStore(t), onFence)
	t.Cleanup(func() { once.Do(func() { close(queried) }) })
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		shortTryRetry(),
		interceptor.WithoutRetryBudget(),
		interceptor.WithClientTracerProvider(tp))...))

	ctx, err := interceptor.StartAttempt(t.Context(), 0, 10*time.Second)
	require.NoError(t, err)
	resp, err := client.Apply(interceptor.WithCallKey(ctx, "pay"), &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	require.NoError(t, err)
	require.Equal(t, int64(7), resp.GetTotal())

	var span *tracetest.SpanStub
	for i, s := range spans.GetSpans() {
		if s.Name == "tollgate.call" {
			span = &spans.GetSpans()[i]
		}
	}
	require.NotNil(t, span)
	var spendTries, retryTries []int64
	for _, e := range span.Events {
		switch e.Name {
		case "tollgate.allowance.spend":
			v, _ := attr(e.Attributes, "tollgate.try")
			spendTries = append(spendTries, v.AsInt64())
		case "tollgate.retry":
			v, _ := attr(e.Attributes, "tollgate.try")
			retryTries = append(retryTries, v.AsInt64())
		}
	}
	final, _ := attr(span.Attributes, "tollgate.try")
	require.Equal(t, []int64{1, 2}, spendTries, "precondition: tries 1 and 2 (the verifying try) were sent")
	require.Equal(t, int64(2), final.AsInt64(), "precondition: the span ends at try 2")
	require.Equal(t, []int64{2}, retryTries, "the verifying try, a repeat sent, has no tollgate.retry event")
}

// One target, two backends in a rolling deploy (the case recordlessFor is
// there for): the first, without a store, runs try 1 of an IDEMPOTENT call
// and its answer is lost, and its AttemptService is UNIMPLEMENTED; the
// owner repeats without the query, as DESIGN.md §3.5 allows. Later, the
// recordless mark has lapsed, and try 2's answer is lost on its way to the
// second backend, which has a store: its fence FENCED(2) vouches only for
// what that store saw. A review found that the fence cleared the call's
// doubt (and freed the grants it held), so a later refusal ended it
// NOT_ADMITTED, although try 1 took effect. An outer interceptor on one server plays the store-less backend
// for try 1 and its query.
func TestRecordlessRepeatThenFenceElsewhereStaysUnknown(t *testing.T) {
	var (
		effects  atomic.Int64
		queries  atomic.Int64
		offsetNs atomic.Int64
	)
	clock := func() time.Time { return time.Now().Add(time.Duration(offsetNs.Load())) }
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch {
		case strings.HasSuffix(info.FullMethod, "/FenceAttempt"):
			if queries.Add(1) == 1 {
				// The store-less backend: tollgate's own answer there.
				return nil, grpcstatus.Error(codes.Unimplemented, "no records")
			}
		case strings.HasSuffix(info.FullMethod, "/Put"):
			switch headerTry(ctx) {
			case "1": // the store-less backend runs it; the answer is lost
				effects.Add(1)
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			case "2": // lost before it reached the backend with records
				offsetNs.Store(int64(2 * time.Minute)) // the recordless mark lapses
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			case "3": // refused before anything ran
				return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
			}
		}
		return handler(ctx, req)
	})
	svc := &testsvc.Service{}
	svc.PutFunc = func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		effects.Add(1)
		return &testingv1.PutResponse{}, nil
	}
	end := recordedServer(t, svc, memoryStore(t), outer)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientClock(clock),
		interceptor.WithoutRetryBudget(),
		interceptor.WithAttemptTimeout(10*time.Minute),
		fastRetry(3),
	)...)
	_, err := testingv1.NewTestServiceClient(conn).Put(t.Context(), &testingv1.PutRequest{Key: "k"})
	require.Equal(t, int64(1), effects.Load(), "try 1 took effect")
	require.Error(t, err)
	require.NotEqual(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind,
		"a fence at one backend does not vouch for a try another backend ran: %v", err)
}

// A tombstone may not free the grant of a try repeated without the query
// (TestRecordlessRepeatThenFenceElsewhereStaysUnknown); a review found that
// a finished record from the same store freed it all the same, though its
// units_spent counts only the tries that store began. Try 1 runs at the store-less backend (its answer lost: its grant
// may be spent below), try 2 runs at the backend with records and its
// answer is lost too; the query finds SUCCEEDED with units_spent 0, and
// ReconcileCall(0, loan1, loan2) returned try 1's grant to the ledger.
func TestRecordlessRepeatThenFinishedRecordKeepsGrantHeld(t *testing.T) {
	var (
		queries   atomic.Int64
		offsetNs  atomic.Int64
		ledgerRef atomic.Pointer[budget.Allowance]
		heldAt2   atomic.Int64
	)
	clock := func() time.Time { return time.Now().Add(time.Duration(offsetNs.Load())) }
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch {
		case strings.HasSuffix(info.FullMethod, "/FenceAttempt"):
			if queries.Add(1) == 1 {
				return nil, grpcstatus.Error(codes.Unimplemented, "no records")
			}
		case strings.HasSuffix(info.FullMethod, "/Put"):
			switch headerTry(ctx) {
			case "1": // the store-less backend runs it (and spends below); the answer is lost
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			case "2": // runs at the backend with records; its answer is lost
				heldAt2.Store(ledgerRef.Load().Snapshot().Held)
				_, _ = handler(ctx, req)
				offsetNs.Store(int64(2 * time.Minute)) // the recordless mark lapses
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			}
		}
		return handler(ctx, req)
	})
	svc := &testsvc.Service{}
	svc.PutFunc = func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		return &testingv1.PutResponse{}, nil
	}
	end := recordedServer(t, svc, memoryStore(t), outer)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientClock(clock),
		interceptor.WithoutRetryBudget(),
		fastRetry(3),
	)...)
	ctx, err := interceptor.StartAttempt(t.Context(), 6, 20*time.Minute)
	require.NoError(t, err)
	l, _ := budget.FromContext(ctx)
	ledgerRef.Store(l)
	_, err = testingv1.NewTestServiceClient(conn).Put(ctx, &testingv1.PutRequest{Key: "k"})
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	t.Logf("err=%v queries=%d ledger=%+v", err, queries.Load(), snap)
	require.Equal(t, int64(2), queries.Load(), "precondition: the second query found the record")
	require.NotZero(t, heldAt2.Load(), "precondition: try 1's grant was held when try 2 arrived")
	require.NotZero(t, snap.Held+snap.Spent,
		"try 1 ran at a backend without records and its answer was lost: its grant stays held, not freed by another store's record")
}

// A try sent while the target was marked recordless may have gone to the
// store-less backend; if the mark lapses before the try's answer is lost,
// the owner queries, and a fence from the backend with a store vouches only
// for what that store saw. A review found that the call then ended
// NOT_ADMITTED although its first try took effect: a record now speaks for
// a call only when its target was not marked recordless while it ran.
func TestTrySentWhileRecordlessThenFenceElsewhereStaysUnknown(t *testing.T) {
	var (
		effects  atomic.Int64
		queries  atomic.Int64
		offsetNs atomic.Int64
		kTries   atomic.Int64
	)
	clock := func() time.Time { return time.Now().Add(time.Duration(offsetNs.Load())) }
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch {
		case strings.HasSuffix(info.FullMethod, "/FenceAttempt"):
			if queries.Add(1) == 1 {
				return nil, grpcstatus.Error(codes.Unimplemented, "no records") // the store-less backend
			}
		case strings.HasSuffix(info.FullMethod, "/Put"):
			r := req.(*testingv1.PutRequest)
			if r.GetKey() == "warm" && queries.Load() == 0 {
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset") // marks the target recordless
			}
			if r.GetKey() == "k" {
				switch kTries.Add(1) {
				case 1: // sent while the mark held; the store-less backend runs it, the answer is lost late
					effects.Add(1)
					offsetNs.Store(int64(2 * time.Minute)) // the recordless mark lapses meanwhile
					return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
				default: // refused before anything ran
					return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
				}
			}
		}
		return handler(ctx, req)
	})
	svc := &testsvc.Service{}
	svc.PutFunc = func(_ context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		if r.GetKey() == "k" {
			effects.Add(1)
		}
		return &testingv1.PutResponse{}, nil
	}
	end := recordedServer(t, svc, memoryStore(t), outer)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientClock(clock),
		interceptor.WithoutRetryBudget(),
		interceptor.WithAttemptTimeout(10*time.Minute),
		fastRetry(2),
	)...)
	cli := testingv1.NewTestServiceClient(conn)
	_, err := cli.Put(t.Context(), &testingv1.PutRequest{Key: "warm"})
	require.NoError(t, err, "precondition: the warm-up call repeated without the query")
	require.Equal(t, int64(1), queries.Load(), "precondition: the target is marked recordless")
	_, err = cli.Put(t.Context(), &testingv1.PutRequest{Key: "k"})
	t.Logf("queries %d, tries %d, err %v", queries.Load(), kTries.Load(), err)
	require.Equal(t, int64(1), effects.Load(), "try 1 took effect")
	require.Error(t, err)
	require.NotEqual(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind,
		"a try sent while the target was known recordless may have run where no record is kept: %v", err)
}

// numberedAndExplicit runs test as two subtests: "numbered" (explicit
// false) and "explicit" (the test keys its call with WithCallKey).
func numberedAndExplicit(t *testing.T, test func(t *testing.T, explicit bool)) {
	t.Helper()
	for _, explicit := range []bool{false, true} {
		name := "numbered"
		if explicit {
			name = "explicit"
		}
		t.Run(name, func(t *testing.T) { test(t, explicit) })
	}
}

// beforeFence is a server interceptor that calls f before each
// FenceAttempt it lets through: a test's hook on the owner's query.
func beforeFence(f func()) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == "/tollgate.v1.AttemptService/FenceAttempt" {
			f()
		}
		return handler(ctx, req)
	})
}

// shortTryRetry is a retry policy of three tries of a second each with
// short backoffs: the owner gives up waiting on a try whose handler blocks,
// and resolves it, well before the attempt's deadline. A second, not less:
// the per-try timeout must not cut a try short before its handler has
// started (the fence would then find the try unrun), nor cut short the
// verifying try that follows a resolution, and a loaded machine takes more
// than 50 ms for either.
func shortTryRetry() interceptor.ClientOption {
	return interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: time.Second,
		InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
}

// headerTry is the try a request's tollgate header names, as a server sees
// it ("1" when the header omits t, as a first try's does).
func headerTry(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, f := range strings.Split(strings.Join(md.Get("tollgate"), ""), ";") {
		if v, ok := strings.CutPrefix(f, "t="); ok {
			return v
		}
	}
	return "1"
}

// When the owner knows a FENCED answer does not vouch for the call
// (unvouched), a review found that it still repeated a method with side
// effects that is not IDEMPOTENT: try 1 ran at the store-less backend, the
// fence came from the store backend, and try 2 ran the handler again. The
// call now ends UNKNOWN there.
func TestUnvouchedFenceDoesNotRepeatAMethodWithSideEffects(t *testing.T) {
	var effects, queries, kTries atomic.Int64
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch {
		case strings.HasSuffix(info.FullMethod, "/FenceAttempt"):
			if queries.Add(1) == 1 {
				return nil, grpcstatus.Error(codes.Unimplemented, "no records") // the store-less backend
			}
		case strings.HasSuffix(info.FullMethod, "/Apply"):
			r := req.(*testingv1.ApplyRequest)
			if r.GetKey() == "warm" {
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset") // its query marks the target recordless
			}
			if r.GetKey() == "k" && kTries.Add(1) == 1 {
				effects.Add(1) // the store-less backend ran it; the answer is lost
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			}
		}
		return handler(ctx, req)
	})
	cli := markedRecordless(t, outer, &effects, &queries)
	_, err := cli.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	t.Logf("queries %d, tries %d, err %v", queries.Load(), kTries.Load(), err)
	require.Equal(t, int64(1), effects.Load(),
		"a fence the owner knows does not vouch for try 1 must not repeat a method with side effects")
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "the answer names the attempt")
}

// markedRecordless serves Apply (counting in effects the handler's runs of
// the key "k") on a recorded server behind outer, the test's stand-in for
// the store-less backend, which answers the "warm" call UNAVAILABLE and the
// first query (counted in queries) UNIMPLEMENTED. It returns a client (three
// quick tries, no retry budget) once its "warm" call ended UNKNOWN and that
// query marked the target recordless.
func markedRecordless(t *testing.T, outer grpc.ServerOption, effects, queries *atomic.Int64) testingv1.TestServiceClient {
	t.Helper()
	svc := &testsvc.Service{ApplyFunc: func(_ context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if r.GetKey() == "k" {
			effects.Add(1)
		}
		return &testingv1.ApplyResponse{}, nil
	}}
	end := recordedServer(t, svc, memoryStore(t), outer)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithoutRetryBudget(),
		fastRetry(3),
	)...)
	cli := testingv1.NewTestServiceClient(conn)
	_, err := cli.Apply(t.Context(), &testingv1.ApplyRequest{Key: "warm"})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "precondition: %v", err)
	require.Equal(t, int64(1), queries.Load(), "precondition: the target is marked recordless")
	return cli
}

// A review found the recordless mark compared with the call's start on the
// client clock: a clock that stepped back more than recordlessFor during
// the call set a mark that ended before the call began, and a try sent
// while that mark held was vouched for by another store's fence. Marks are
// now counted, whatever the clock does.
func TestClockStepBackDoesNotHideAMarkDuringTheCall(t *testing.T) {
	var effects, queries, kTries, offsetNs atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offsetNs.Load())) }
	var cli testingv1.TestServiceClient
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch {
		case strings.HasSuffix(info.FullMethod, "/FenceAttempt"):
			if queries.Add(1) == 1 {
				return nil, grpcstatus.Error(codes.Unimplemented, "no records")
			}
		case strings.HasSuffix(info.FullMethod, "/Apply"):
			return nil, grpcstatus.Error(codes.Unavailable, "connection reset") // its query marks the target
		case strings.HasSuffix(info.FullMethod, "/Put"):
			if req.(*testingv1.PutRequest).GetKey() != "k" {
				break
			}
			switch kTries.Add(1) {
			case 1: // refused before anything ran; meanwhile the clock steps back and another call marks the target
				offsetNs.Store(int64(-5 * time.Minute))
				_, _ = cli.Apply(context.Background(), &testingv1.ApplyRequest{Key: "mark"})
				return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
			case 2: // sent while the mark held; the store-less backend runs it; the mark lapses before the answer is lost
				effects.Add(1)
				offsetNs.Store(int64(-3 * time.Minute))
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset")
			default:
				return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
			}
		}
		return handler(ctx, req)
	})
	svc := &testsvc.Service{}
	end := recordedServer(t, svc, memoryStore(t), outer)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientClock(clock),
		interceptor.WithoutRetryBudget(),
		interceptor.WithAttemptTimeout(10*time.Minute),
		fastRetry(4),
	)...)
	cli = testingv1.NewTestServiceClient(conn)
	_, err := cli.Put(t.Context(), &testingv1.PutRequest{Key: "k"})
	t.Logf("queries %d, tries %d, err %v", queries.Load(), kTries.Load(), err)
	require.Equal(t, int64(2), queries.Load(), "precondition: one query marked the target, one fenced try 2")
	require.Equal(t, int64(1), effects.Load())
	require.NotEqual(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind,
		"try 2 was sent while the target was marked recordless: %v", err)
}

// A call keyed explicitly whose lost try the store backend recorded
// SUCCEEDED sends a verifying try. While its target is known to mix
// backends with and without a store (unvouched), that try may reach the
// store-less backend, which runs the handler again: a review found that the
// verify path repeated a method with side effects there; it now ends the
// call UNKNOWN, as the fence path does.
func TestUnvouchedVerifyingTryDoesNotRerunAMethodWithSideEffects(t *testing.T) {
	var effects, queries, kTries atomic.Int64
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch {
		case strings.HasSuffix(info.FullMethod, "/FenceAttempt"):
			if queries.Add(1) == 1 {
				return nil, grpcstatus.Error(codes.Unimplemented, "no records") // the store-less backend
			}
		case strings.HasSuffix(info.FullMethod, "/Apply"):
			r := req.(*testingv1.ApplyRequest)
			if r.GetKey() == "warm" {
				return nil, grpcstatus.Error(codes.Unavailable, "connection reset") // its query marks the target recordless
			}
			if r.GetKey() == "k" {
				return verifyAtStoreless(ctx, req, handler, &kTries, &effects)
			}
		}
		return handler(ctx, req)
	})
	cli := markedRecordless(t, outer, &effects, &queries)
	_, err := cli.Apply(interceptor.WithCallKey(t.Context(), "pay"), &testingv1.ApplyRequest{Key: "k"})
	t.Logf("queries %d, tries %d, err %v", queries.Load(), kTries.Load(), err)
	require.Equal(t, int64(2), queries.Load(), "precondition: try 1 was resolved at the store backend")
	require.Equal(t, int64(1), effects.Load(),
		"the record of the store backend does not vouch for the target: a verifying try must not run the handler again")
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
}

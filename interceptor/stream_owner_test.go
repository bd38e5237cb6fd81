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
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	grpcstatus "google.golang.org/grpc/status"
)

// fastRetry is a retry policy whose waits are short.
func fastRetry(tries int) interceptor.ClientOption {
	return interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: tries, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
}

// shed is a refusal without effect, as a handler returns it.
func shed() error {
	return status.WithoutEffect(status.NotAdmitted(status.ReasonShed, status.WithRetryAfter(time.Millisecond)))
}

// recvAll reads a Watch to its end and returns the values and the error
// (nil for io.EOF).
func recvAll[T interface{ GetValue() string }](st interface{ Recv() (T, error) }) ([]string, error) {
	var got []string
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, m.GetValue())
	}
}

func sendWatch(st grpc.ServerStreamingServer[testingv1.WatchResponse], n int32) error {
	for i := range n {
		if err := st.Send(&testingv1.WatchResponse{Value: strconv.Itoa(int(i))}); err != nil {
			return err
		}
	}
	return nil
}

// TestStreamWatchRepeatsBeforeItsFirstMessage: a server-streaming call whose
// first try fails before any response message (refused, or failed after a
// header alone) is repeated; the caller receives every message of the
// second try, once, and each try's grant is settled: the tollgate callee
// reports tollgate-spent with a refusal and with an UNKNOWN answer alike (0:
// it spent nothing), so neither grant is held.
func TestStreamWatchRepeatsBeforeItsFirstMessage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func(st grpc.ServerStreamingServer[testingv1.WatchResponse]) error
	}{
		{"refused NOT_ADMITTED", func(grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			return status.NotAdmitted(status.ReasonShed, status.WithRetryAfter(time.Millisecond))
		}},
		{"failed after a header", func(st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			if err := st.SendHeader(metadata.Pairs("try", "1")); err != nil {
				return err
			}
			return grpcstatus.Error(codes.Unavailable, "backend went away")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			svc := &testsvc.Service{WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
				if runs.Add(1) == 1 {
					return tc.first(st)
				}
				return sendWatch(st, r.GetCount())
			}}
			reader := sdkmetric.NewManualReader()
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3),
				interceptor.WithClientMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))...))
			ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)

			st, err := client.Watch(ctx, &testingv1.WatchRequest{Count: 3})
			require.NoError(t, err)
			got, err := recvAll(st)
			require.NoError(t, err)
			require.Equal(t, []string{"0", "1", "2"}, got, "every message once")
			require.Equal(t, int64(2), svc.Calls("Watch"))

			ledger, _ := budget.FromContext(ctx)
			snap := ledger.Snapshot()
			require.Zero(t, snap.Reserved, "both tries' grants settled")
			require.Zero(t, snap.Held, "the callee said what it spent")
			require.Equal(t, int64(4), snap.Free)
			var rm metricdata.ResourceMetrics
			require.NoError(t, reader.Collect(t.Context(), &rm))
			require.Equal(t, int64(2), counter(rm, "tollgate.client.tries"))
		})
	}
}

// TestStreamWatchFailingAfterItsFirstMessageIsNotRepeated: once a response
// message arrived, a failure is the stream's result.
func TestStreamWatchFailingAfterItsFirstMessageIsNotRepeated(t *testing.T) {
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		if err := sendWatch(st, 1); err != nil {
			return err
		}
		return grpcstatus.Error(codes.Unavailable, "backend went away")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	st, err := client.Watch(t.Context(), &testingv1.WatchRequest{Count: 3})
	require.NoError(t, err)
	got, err := recvAll(st)
	require.Equal(t, []string{"0"}, got)
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	require.Equal(t, int64(1), svc.Calls("Watch"), "never repeated")
	// Further calls keep answering the stream's end.
	_, err2 := st.Recv()
	require.Equal(t, grpcstatus.Code(err), grpcstatus.Code(err2))
}

// recorder notes the values each run of a streaming handler received.
type recorder struct {
	mu   sync.Mutex
	runs [][]string
}

func (r *recorder) start() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, nil)
	return len(r.runs) - 1
}

func (r *recorder) add(run int, v string) {
	r.mu.Lock()
	r.runs[run] = append(r.runs[run], v)
	r.mu.Unlock()
}

func (r *recorder) all() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.runs...)
}

// uploadService refuses (without effect) the first run of Upload after it
// read refuseAfter messages (0: at once; -1: all of them), and counts the
// messages of the others.
func uploadService(rec *recorder, refuseAfter int) *testsvc.Service {
	return &testsvc.Service{UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		run := rec.start()
		if run == 0 && refuseAfter == 0 {
			return shed()
		}
		var n int32
		for {
			m, err := st.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			rec.add(run, m.GetValue())
			n++
			if run == 0 && int(n) == refuseAfter {
				return shed()
			}
		}
		if run == 0 {
			return shed()
		}
		return st.SendAndClose(&testingv1.UploadResponse{Count: n})
	}}
}

func values(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// TestStreamUploadRefusedBeforeAnyResponseIsReplayed: a client-streaming
// call refused (without effect) before any response is repeated with every
// message the caller sent, and CloseSend.
func TestStreamUploadRefusedBeforeAnyResponseIsReplayed(t *testing.T) {
	for _, refuseAfter := range []int{1, 5} {
		t.Run("refused after "+strconv.Itoa(refuseAfter), func(t *testing.T) {
			rec := &recorder{}
			svc := uploadService(rec, refuseAfter)
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
			ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)

			st, err := client.Upload(ctx)
			require.NoError(t, err)
			for _, v := range values("u", 5) {
				require.NoError(t, st.Send(&testingv1.UploadRequest{Value: v}))
			}
			resp, err := st.CloseAndRecv()
			require.NoError(t, err)
			require.Equal(t, int32(5), resp.GetCount())
			runs := rec.all()
			require.Len(t, runs, 2)
			require.Equal(t, values("u", 5), runs[1], "try 2 received every message, in order")
			ledger, _ := budget.FromContext(ctx)
			snap := ledger.Snapshot()
			require.Zero(t, snap.Reserved+snap.Held)
		})
	}
}

// TestStreamChatRefusedBeforeAnyResponseIsReplayed: a bidi call whose first
// try is refused after it read a message, while the caller waits for the
// answer, is repeated with the messages sent so far; the caller goes on and
// sees each answer once.
func TestStreamChatRefusedBeforeAnyResponseIsReplayed(t *testing.T) {
	rec := &recorder{}
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		run := rec.start()
		return echoChat(st, func(m *testingv1.ChatRequest) error {
			rec.add(run, m.GetValue())
			if run == 0 {
				return shed()
			}
			return nil
		})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	st, err := client.Chat(t.Context())
	require.NoError(t, err)
	for _, v := range []string{"a", "b", "c"} {
		require.NoError(t, st.Send(&testingv1.ChatRequest{Value: v}))
		m, err := st.Recv()
		require.NoError(t, err)
		require.Equal(t, v, m.GetValue())
	}
	require.NoError(t, st.CloseSend())
	_, err = st.Recv()
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, [][]string{{"a"}, {"a", "b", "c"}}, rec.all())
}

// TestStreamChatAfterAHeaderIsNotReplayed: a bidi try that sent a response
// header is committed: its refusal is the stream's result.
func TestStreamChatAfterAHeaderIsNotReplayed(t *testing.T) {
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		if _, err := st.Recv(); err != nil {
			return err
		}
		if err := st.SendHeader(metadata.Pairs("k", "v")); err != nil {
			return err
		}
		return shed()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	st, err := client.Chat(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{Value: "a"}))
	md, err := st.Header()
	require.NoError(t, err)
	require.Equal(t, []string{"v"}, md.Get("k"))
	_, err = st.Recv()
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, int64(1), svc.Calls("Chat"))
}

// TestStreamUploadPastTheReplayLimitIsNotReplayed: once the caller sent more
// than StreamReplayLimit, a refusal is the stream's result.
func TestStreamUploadPastTheReplayLimitIsNotReplayed(t *testing.T) {
	rec := &recorder{}
	svc := uploadService(rec, -1)
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	st, err := client.Upload(t.Context())
	require.NoError(t, err)
	big := strings.Repeat("x", 64<<10)
	n := interceptor.StreamReplayLimit/len(big) + 1
	for range n {
		if err := st.Send(&testingv1.UploadRequest{Value: big}); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
	}
	_, err = st.CloseAndRecv()
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonShed, o.Reason)
	require.Len(t, rec.all(), 1, "never replayed")
}

// dropper is an outermost server stream interceptor playing a proxy: for
// the first Upload it either reads the caller's messages and fails without
// forwarding them, or forwards and then loses the answer (after commit).
func dropper(after bool) grpc.ServerOption {
	var dropped atomic.Bool
	return grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod != testingv1.TestService_Upload_FullMethodName || !dropped.CompareAndSwap(false, true) {
			return h(srv, ss)
		}
		if after {
			if err := h(srv, &noSend{ss}); err != nil {
				return err
			}
		} else {
			// Read everything the caller sends, so that it fails only once
			// the caller is done sending.
			for ss.RecvMsg(&testingv1.UploadRequest{}) == nil {
			}
		}
		return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
	})
}

// noSend swallows the handler's response, as a lost answer.
type noSend struct{ grpc.ServerStream }

func (noSend) SendMsg(any) error { return nil }

// TestStreamUnknownTriesAreResolvedBeforeRepeat: an Upload whose try's
// outcome is unknown is resolved with FenceAttempt: a try that never ran is
// fenced and replayed (when what was sent was kept) or ends NOT_ADMITTED;
// a try that committed ends COMMITTED. The handler never runs twice.
func TestStreamUnknownTriesAreResolvedBeforeRepeat(t *testing.T) {
	small := []string{"a", "b", "c"}
	big := make([]string, replayChunks())
	for i := range big {
		big[i] = strings.Repeat("x", 64<<10)
	}
	for _, tc := range []struct {
		name      string
		after     bool
		msgs      []string
		wantKind  status.Kind
		wantRuns  int
		wantCount int32
	}{
		{"never ran, kept: replayed", false, small, status.KindOK, 1, 3},
		{"never ran, past the limit: not admitted", false, big, status.KindNotAdmitted, 0, 0},
		{"committed: COMMITTED", true, small, status.KindCommitted, 1, 0},
		{"committed past the limit: COMMITTED", true, big, status.KindCommitted, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			svc := &testsvc.Service{UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
				run := rec.start()
				var n int32
				for {
					m, err := st.Recv()
					if err == io.EOF {
						return st.SendAndClose(&testingv1.UploadResponse{Count: n})
					}
					if err != nil {
						return err
					}
					rec.add(run, m.GetValue()[:1])
					n++
				}
			}}
			end := recordedServer(t, svc, memoryStore(t), dropper(tc.after))
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

			st, err := client.Upload(t.Context())
			require.NoError(t, err)
			for _, v := range tc.msgs {
				if err := st.Send(&testingv1.UploadRequest{Value: v}); err != nil {
					require.ErrorIs(t, err, io.EOF)
					break
				}
			}
			resp, err := st.CloseAndRecv()
			o := status.OutcomeOf(err)
			require.Equal(t, tc.wantKind, o.Kind, "%v", err)
			require.Len(t, rec.all(), tc.wantRuns, "the handler ran at most once")
			if tc.wantKind == status.KindOK {
				require.Equal(t, tc.wantCount, resp.GetCount())
				require.Equal(t, tc.msgs, rec.all()[0])
			} else {
				require.NotEmpty(t, o.Detail.GetAttemptId())
			}
		})
	}
}

// replayChunks is how many 64 KiB messages pass StreamReplayLimit.
func replayChunks() int { return interceptor.StreamReplayLimit/(64<<10) + 1 }

// TestStreamRepeatsSpendTheAllowance: below the origin each try of a stream
// takes a unit: a middle tier granted 2 units sends a Watch its dependency
// keeps refusing at most twice, whatever its MaxTries.
func TestStreamRepeatsSpendTheAllowance(t *testing.T) {
	dep := &testsvc.Service{WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		return status.NotAdmitted(status.ReasonShed)
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		st, err := depClient.Watch(ctx, &testingv1.WatchRequest{Count: 1})
		if err == nil {
			_, err = recvAll(st)
		}
		return nil, err
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithAllowance(2), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.Error(t, err)
	require.Equal(t, int64(2), dep.Calls("Watch"), "two units, two tries")
}

// TestStreamRepeatsSpendTheRetryBudget: each repeat of a stream costs a
// retry-budget token; an empty budget stops the repeats.
func TestStreamRepeatsSpendTheRetryBudget(t *testing.T) {
	svc := &testsvc.Service{WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		return status.NotAdmitted(status.ReasonShed)
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3),
		interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1)))...))

	for i, wantCalls := range []int64{2, 3} {
		st, err := client.Watch(t.Context(), &testingv1.WatchRequest{Count: 1})
		if err == nil {
			_, err = recvAll(st)
		}
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind, "stream %d: %v", i, err)
		require.Equal(t, status.ReasonRetryBudgetExhausted, o.Reason, "stream %d", i)
		require.Equal(t, wantCalls, svc.Calls("Watch"), "stream %d", i)
	}
}

// trailerSignal is a client stats handler that closes its channel when the
// first try's status arrives.
type trailerSignal struct {
	once sync.Once
	c    chan struct{}
}

func (s *trailerSignal) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (s *trailerSignal) HandleRPC(_ context.Context, st stats.RPCStats) {
	if _, ok := st.(*stats.InTrailer); ok {
		s.once.Do(func() { close(s.c) })
	}
}
func (s *trailerSignal) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (s *trailerSignal) HandleConn(context.Context, stats.ConnStats) {}

// TestStreamSendMsgRepeatsATryThatEnded: the caller goes on sending after
// its first try was refused; SendMsg finds the try ended, repeats it, and
// the second try receives every message.
func TestStreamSendMsgRepeatsATryThatEnded(t *testing.T) {
	rec := &recorder{}
	svc := uploadService(rec, 0) // refuses its first run before reading
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	sig := &trailerSignal{c: make(chan struct{})}
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithStatsHandler(sig))...))

	st, err := client.Upload(t.Context())
	require.NoError(t, err)
	require.NotNil(t, st.Context())
	want := values("u", 6)
	require.NoError(t, st.Send(&testingv1.UploadRequest{Value: want[0]}))
	<-sig.c // try 1's refusal arrived
	for _, v := range want[1:] {
		require.NoError(t, st.Send(&testingv1.UploadRequest{Value: v}), "the repeat is transparent")
	}
	resp, err := st.CloseAndRecv()
	require.NoError(t, err)
	require.Equal(t, int32(len(want)), resp.GetCount())
	runs := rec.all()
	require.Len(t, runs, 2)
	require.Equal(t, want, runs[1])
}

// TestStreamHeaderRepeatsATryThatEnded: Header waits for the response
// header; when the try ends without one it is repeated, and Header answers
// with the new try's.
func TestStreamHeaderRepeatsATryThatEnded(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		n := runs.Add(1)
		if n == 1 {
			return status.NotAdmitted(status.ReasonShed)
		}
		if err := st.SendHeader(metadata.Pairs("run", strconv.FormatInt(n, 10))); err != nil {
			return err
		}
		return sendWatch(st, r.GetCount())
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	st, err := client.Watch(t.Context(), &testingv1.WatchRequest{Count: 2})
	require.NoError(t, err)
	md, err := st.Header()
	require.NoError(t, err)
	require.Equal(t, []string{"2"}, md.Get("run"))
	got, err := recvAll(st)
	require.NoError(t, err)
	require.Equal(t, []string{"0", "1"}, got)
}

// TestStreamChatSenderAndReceiverApart: one goroutine sends, another
// receives (grpc.ClientStream's concurrency contract) while the first try
// is refused after two messages: every answer arrives once, in order.
func TestStreamChatSenderAndReceiverApart(t *testing.T) {
	rec := &recorder{}
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		run := rec.start()
		return eachChat(st, func(m *testingv1.ChatRequest) error {
			rec.add(run, m.GetValue())
			if run == 0 {
				if len(rec.all()[0]) == 2 {
					return shed()
				}
				return nil // answers nothing: the first response would commit the try
			}
			return st.Send(&testingv1.ChatResponse{Value: m.GetValue()})
		})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	st, err := client.Chat(t.Context())
	require.NoError(t, err)
	want := values("c", 20)
	var wg sync.WaitGroup
	var sendErr error
	wg.Go(func() {
		for _, v := range want {
			if sendErr = st.Send(&testingv1.ChatRequest{Value: v}); sendErr != nil {
				return
			}
		}
		sendErr = st.CloseSend()
	})
	var got []string
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		got = append(got, m.GetValue())
	}
	wg.Wait()
	require.NoError(t, sendErr)
	require.Equal(t, want, got)
	runs := rec.all()
	require.Len(t, runs, 2)
	require.Equal(t, want, runs[1])
}

// TestStreamAbandonedByCancelSettlesItsTry: a caller that cancels its
// context instead of reading the stream to its end releases the try: its
// grant is no longer reserved, and later calls see the stream ended.
func TestStreamAbandonedByCancelSettlesItsTry(t *testing.T) {
	started := make(chan struct{})
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		close(started)
		<-st.Context().Done()
		return st.Context().Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(actx)

	st, err := client.Watch(ctx, &testingv1.WatchRequest{Count: 1})
	require.NoError(t, err)
	<-started
	ledger, _ := budget.FromContext(actx)
	require.Equal(t, int64(4), ledger.Snapshot().Reserved, "the try's grant is lent")
	cancel()
	_, err = st.Recv()
	require.Equal(t, codes.Canceled, grpcstatus.Code(err))
	require.Zero(t, ledger.Snapshot().Reserved, "the abandoned try was settled")
	require.Equal(t, int64(1), svc.Calls("Watch"), "never repeated after the caller left")
}

// TestStreamUnknownWithoutAttemptServiceIsNotReplayed: a callee that keeps
// no records cannot be queried: an Upload whose try's outcome is unknown
// ends UNKNOWN with its attempt ID and is never replayed blindly.
func TestStreamUnknownWithoutAttemptServiceIsNotReplayed(t *testing.T) {
	rec := &recorder{}
	svc := uploadService(rec, -1)
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, append([]grpc.ServerOption{dropper(false)}, serverOpts()...)...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	st, err := client.Upload(t.Context())
	require.NoError(t, err)
	for _, v := range values("u", 3) {
		require.NoError(t, st.Send(&testingv1.UploadRequest{Value: v}))
	}
	_, err = st.CloseAndRecv()
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "UNKNOWN names its attempt")
	require.Empty(t, rec.all(), "never replayed")
}

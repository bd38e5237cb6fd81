package interceptor_test

import (
	"context"
	"strconv"
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
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

const fenceAttemptMethod = "/tollgate.v1.AttemptService/FenceAttempt"

// Review 13 found that a resolution whose FenceAttempt query never left the
// client (an inner interceptor, or grpc-go with no connection ready, failed
// it before any header went out) kept the retry-budget token the owner
// withdrew for the resolution: the call ended UNKNOWN, as it should (a
// failed query stops the call), but the budget, which bounds the repeats
// and resolutions sent to the target, counted a query that put no load on
// it, and another call to the same target found no token for the repeat it
// needed. A repeat never sent gives its token back; so now does a
// resolution none of whose queries was sent.
func TestRetryTokenOfAQueryNeverSentGoesBack(t *testing.T) {
	var bRuns atomic.Int32
	ledger := newLedger(nil)
	ledger.GetFunc = shedFirstGet(&bRuns)
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	var queries atomic.Int32
	inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch method {
		case fenceAttemptMethod:
			queries.Add(1)
			return grpcstatus.Error(codes.Unavailable, "no connection ready") // before any header went out
		case testingv1.TestService_Apply_FullMethodName:
			if err := inv(ctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
			// The try ran, but its answer reads as lost.
			return grpcstatus.Error(codes.DeadlineExceeded, "answer lost")
		}
		return inv(ctx, method, req, reply, cc, opts...)
	}
	client := oneTokenClient(t, end, inner)

	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "a failed query stops the call UNKNOWN: %v", err)
	require.EqualValues(t, 1, queries.Load(), "the try was resolved once")
	require.EqualValues(t, 1, ledger.effects.Load(), "the try in doubt was not repeated")

	requireCallBGetsTheToken(t, client, &bRuns)
}

// Review 13 found that an inner client interceptor that sends the try with
// a context not derived from the one tollgate gave it (context.Background()
// with the outgoing metadata copied) hid the try from tollgate's delivery
// record, which lives on that context: the stats handler, installed by
// DialOptions, saw no OutHeader for it, so a try that reached the server
// read as never sent (NOT_SENT), its unit was refunded, and a method with
// side effects was repeated without the query (invariant 5), its handler
// running once per try. The stats handler now notices an RPC carrying a
// try's tollgate header but not the try's context, and a try that saw none
// of its own events while such an RPC started counts as maybe sent.
func TestTrySentOnAReRootedContextIsMaybeSent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reroot func(ctx context.Context) context.Context
	}{
		{"background with metadata", func(ctx context.Context) context.Context {
			md, _ := metadata.FromOutgoingContext(ctx)
			return metadata.NewOutgoingContext(context.Background(), md)
		}},
		{"without cancel, values dropped", func(ctx context.Context) context.Context {
			md, _ := metadata.FromOutgoingContext(ctx)
			dl, _ := ctx.Deadline()
			c, cancel := context.WithDeadline(metadata.NewOutgoingContext(context.Background(), md), dl)
			context.AfterFunc(ctx, cancel)
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				runs.Add(1)
				return nil, grpcstatus.Error(codes.Internal, "effect done, then failed")
			}}
			// A server that does not speak tollgate: its answer has no
			// tollgate detail, so only the delivery record tells sent
			// from not sent.
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
			reroot := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				return inv(tc.reroot(ctx), method, req, reply, cc, opts...)
			}
			c := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
				grpc.WithChainUnaryInterceptor(reroot))...))
			_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			o := status.OutcomeOf(err)
			require.EqualValues(t, 1, runs.Load(), "a sent try was read as never sent and repeated without the query: %v", err)
			require.Equal(t, status.KindUnknown, o.Kind, "the try may have run: its outcome is unknown (%v)", err)
		})
	}
}

// An inner interceptor's own refusal, made before anything was sent, stays
// NOT_SENT and is repeated, as before: the re-rooting check above does not
// make every untagged try maybe sent.
func TestInnerRefusalBeforeSendingStaysNotSent(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return &testingv1.ApplyResponse{Total: 1}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	var refused atomic.Bool
	limiter := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if refused.CompareAndSwap(false, true) {
			return grpcstatus.Error(codes.ResourceExhausted, "local limiter")
		}
		return inv(ctx, method, req, reply, cc, opts...)
	}
	c := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithChainUnaryInterceptor(limiter))...))
	_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	require.NoError(t, err, "the limiter's refusal was never sent: the call repeats it")
	require.EqualValues(t, 1, runs.Load())
}

// Review 13 checked the owner's jumps past fences named in ATTEMPT_FENCED
// refusals. Try numbers stay monotonic and within the header's bound
// (header.MaxTry) whatever fenced_through_try a refusal names, but for a
// call keyed with WithCallKey every refusal's jump was uncounted, so a
// callee that refused every try as fenced through that very try (another
// run's ballots, again and again, or a faulty store) had the call repeated
// up to the header's 1000 tries, far past the policy's MaxTries, bounded
// only by the deadline and the retry budget. As with verifying tries, the
// first jump of a call is uncounted and later ones count, so that refusals
// met again and again cannot repeat the call unbounded.
func TestRepeatedFenceRefusalsStayWithinThePolicy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fence func(try uint32) uint32
	}{
		{"each fence covers the try refused", func(n uint32) uint32 { return n }},
		{"each fence names the header's last try", func(uint32) uint32 { return 999 }},
		{"each fence names an absurd try", func(uint32) uint32 { return 1 << 31 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tries []uint32
			triesCh := make(chan uint32, 2000)
			svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				hdr := append(metadata.ValueFromIncomingContext(ctx, "tollgate"), "")
				n := uint64(1) // the header's default
				if v := fieldOf(hdr[0], "t"); v != "" {
					n, _ = strconv.ParseUint(v, 10, 32) // 0 fails the test below
				}
				triesCh <- uint32(n)
				return nil, status.NotAdmitted(status.ReasonAttemptFenced, status.Fields{
					AttemptID: fieldOf(hdr[0], "a"), Call: fieldOf(hdr[0], "c"), Try: uint32(n),
					FencedThroughTry: tc.fence(uint32(n)),
				})
			}}
			// A server that does not speak tollgate passes the store's
			// refusal as it came (it names this very try).
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
			const maxTries = 3
			c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(maxTries),
				interceptor.WithoutRetryBudget(), interceptor.WithAttemptTimeout(time.Minute))...))
			_, err := c.Apply(interceptor.WithCallKey(t.Context(), "pay"), &testingv1.ApplyRequest{Key: "k"})
			close(triesCh)
			for n := range triesCh {
				tries = append(tries, n)
			}
			require.Error(t, err)
			require.NotEqual(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "fenced tries leave the call in doubt: %v", err)
			require.NotEmpty(t, tries)
			require.NotContains(t, tries, uint32(0), "every try carried its number")
			for i := 1; i < len(tries); i++ {
				require.Greater(t, tries[i], tries[i-1], "try numbers only grow: %v", tries)
			}
			require.LessOrEqual(t, tries[len(tries)-1], uint32(1000), "no try past the header's bound: %v", tries)
			require.LessOrEqual(t, len(tries), maxTries+1, "tries sent: %v (the first jump is uncounted, later ones count)", tries)
		})
	}
}

// lateClock is a client clock that, once armed, reads the time as it is on
// its first read (the owner's check that a repeat's backoff fits the
// deadline) and then as `ahead` later on every read after: the backoff
// timer fired late on a loaded machine.
type lateClock struct {
	state atomic.Int32 // lateIdle, lateArmed, lateChecked, lateLate
	ahead time.Duration
}

const (
	lateIdle    = iota // the time as it is
	lateArmed          // the next read is the fit check, as it is
	lateChecked        // the reads from the next on are late
	lateLate
)

func (c *lateClock) now() time.Time {
	switch {
	case c.state.CompareAndSwap(lateArmed, lateChecked):
	case c.state.CompareAndSwap(lateChecked, lateLate), c.state.Load() == lateLate:
		return time.Now().Add(c.ahead)
	}
	return time.Now()
}

// Review 13 found that a repeat whose backoff fitted the deadline when the
// owner checked it, but whose timer fired late (a loaded machine), was
// refused locally by prepare, DEADLINE_UNREACHABLE, and that refusal became
// the call's result: the previous try's real outcome — the one the caller
// would have got had the owner found before the wait that no repeat fits —
// was replaced by a local refusal of a try never sent (NOT_ADMITTED, final,
// naming try 2; or, after a try in doubt, UNKNOWN whose message and cause
// are the local refusal's, the callee's error lost). The call now ends with
// the previous try's outcome, as when the backoff does not fit.
func TestLateBackoffReturnsThePreviousTrysOutcome(t *testing.T) {
	const timeout = 10 * time.Second
	for _, tc := range []struct {
		name     string
		kind     status.Kind
		reason   status.Reason
		code     codes.Code
		fail     error
		method   string
		contains string
	}{
		{"refused without effect", status.KindNotAdmitted, status.ReasonShed, codes.ResourceExhausted,
			status.WithoutEffect(status.NotAdmitted(status.ReasonShed, status.WithRetryAfter(time.Millisecond), status.WithMessage("the queue sheds"))),
			testingv1.TestService_Get_FullMethodName, "the queue sheds"},
		{"in doubt", status.KindUnknown, status.ReasonUnspecified, codes.Internal,
			grpcstatus.Error(codes.Internal, "the database failed mid-write"),
			testingv1.TestService_Get_FullMethodName, "the database failed mid-write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &lateClock{ahead: timeout - time.Millisecond}
			var runs atomic.Int32
			svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
				runs.Add(1)
				clock.state.CompareAndSwap(lateIdle, lateArmed)
				return nil, tc.fail
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3),
				interceptor.WithAttemptTimeout(timeout), interceptor.WithClientClock(clock.now),
				interceptor.WithoutRetryBudget())...))
			_, err := c.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
			o := status.OutcomeOf(err)
			require.EqualValues(t, 1, runs.Load(), "the late repeat was not sent")
			require.Equal(t, int32(lateLate), clock.state.Load(), "the clock read late after the backoff")
			require.Equal(t, tc.kind, o.Kind, "%v", err)
			require.Equal(t, tc.reason, o.Reason, "the previous try's reason, not a local refusal's: %v", err)
			require.Equal(t, tc.code, grpcstatus.Code(err), "%v", err)
			require.Contains(t, grpcstatus.Convert(err).Message(), tc.contains, "the callee's error is kept")
			require.EqualValues(t, 1, o.Detail.GetTry(), "the result names the last try sent: %v", err)
			require.False(t, o.Final(), "a refusal the callee did not make final is not made final here: %v", err)
		})
	}
}

// The stream owner settles its tries as the unary one does: a client
// stream sent by an inner stream interceptor on a re-rooted context is
// maybe sent too, and not replayed blindly (see
// TestTrySentOnAReRootedContextIsMaybeSent).
func TestStreamSentOnAReRootedContextIsMaybeSent(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		runs.Add(1)
		_, _ = testsvc.DrainUpload(st)
		return grpcstatus.Error(codes.Internal, "effect done, then failed")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register) // no tollgate: no detail
	reroot := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		md, _ := metadata.FromOutgoingContext(ctx)
		rctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
		context.AfterFunc(ctx, cancel)
		return streamer(rctx, desc, cc, method, opts...)
	}
	c := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithChainStreamInterceptor(reroot))...))
	st, err := c.Upload(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.UploadRequest{}))
	_, err = st.CloseAndRecv()
	require.EqualValues(t, 1, runs.Load(), "a sent stream was read as never sent and replayed without the query: %v", err)
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
}

// A stream's repeat whose backoff ran late ends with the try it followed,
// as a unary call's does (see TestLateBackoffReturnsThePreviousTrysOutcome).
func TestStreamLateBackoffReturnsThePreviousTrysOutcome(t *testing.T) {
	const timeout = 10 * time.Second
	clock := &lateClock{ahead: timeout - time.Millisecond}
	var runs atomic.Int32
	svc := &testsvc.Service{WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		runs.Add(1)
		clock.state.CompareAndSwap(lateIdle, lateArmed)
		return grpcstatus.Error(codes.Internal, "the feed failed")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3),
		interceptor.WithAttemptTimeout(timeout), interceptor.WithClientClock(clock.now),
		interceptor.WithoutRetryBudget())...))
	st, err := c.Watch(t.Context(), &testingv1.WatchRequest{Key: "k"})
	if err == nil {
		_, err = st.Recv()
	}
	o := status.OutcomeOf(err)
	require.EqualValues(t, 1, runs.Load(), "the late repeat was not sent")
	require.Equal(t, int32(lateLate), clock.state.Load(), "the clock read late after the backoff")
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.Equal(t, codes.Internal, grpcstatus.Code(err), "%v", err)
	require.Contains(t, grpcstatus.Convert(err).Message(), "the feed failed", "the callee's error is kept")
	require.NotEqual(t, status.ReasonDeadlineUnreachable, o.Reason, "%v", err)
}

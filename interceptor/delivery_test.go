package interceptor_test

import (
	"context"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// An interceptor below tollgate's that sends the try's very request message
// to an audit method on the same connection was taken for the try by a first
// fix of TestRenamedTryIsMaybeSent, which recognised a renamed try by its
// request: the audit call's trailer (tollgate-spent 0 under strict
// accounting) was booked as the try's, and when the real try then lost its
// response the caller freed a grant the callee still held (DESIGN §3.3;
// found by review). A side RPC's events are never the try's.
func TestAuditSideRPCWithTheSameRequestIsNotTheTry(t *testing.T) {
	// The callee is still working (and could be spending its grant) when the
	// caller stops waiting: it answers only once the test ends, whatever its
	// context says (its own deadline, a hop margin earlier than the caller's,
	// would otherwise race the caller's and sometimes answer in time).
	working := make(chan struct{})
	leafSvc := &testsvc.Service{
		ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			<-working
			return &testingv1.ApplyResponse{}, nil
		},
	}
	leaf := testsvc.StartT(t, testsvc.Bufconn, leafSvc.Register, append(interceptor.ServerOptions(
		interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0)),
		grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
			var m testingv1.ApplyRequest
			if err := st.RecvMsg(&m); err != nil {
				return err
			}
			return st.SendMsg(&emptypb.Empty{})
		}))...)
	audit := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == testingv1.TestService_Apply_FullMethodName {
			// as TestSideRPCOfALaterInterceptorIsNotTheTry's side RPC, but
			// recording the request itself
			if err := inv(ctx, "/audit.v1.Audit/Record", req, new(emptypb.Empty), cc); err != nil {
				return err
			}
		}
		return inv(ctx, method, req, reply, cc, opts...)
	}
	t.Cleanup(func() { close(working) }) // before the server stops (cleanups run last first)
	conn := leaf.DialT(t, append(interceptor.DialOptions(
		interceptor.WithStrictAccounting(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1, PerTryTimeout: 200 * time.Millisecond})),
		grpc.WithChainUnaryInterceptor(audit))...)
	client := testingv1.NewTestServiceClient(conn)
	ctx, err := interceptor.StartAttempt(t.Context(), 5, 10*time.Second)
	require.NoError(t, err)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
	o := status.OutcomeOf(err)
	ledger, _ := budget.FromContext(ctx)
	s := ledger.Snapshot()
	t.Logf("kind=%v reason=%v err=%v ledger=%+v", o.Kind, status.ReasonName(o.Reason), err, s)
	require.NotZero(t, s.Held, "the try's response never came: its grant must be held, not refunded")
}

// TestSideRPCOfALaterInterceptorIsNotTheTry: an interceptor placed after
// tollgate's makes an auxiliary RPC with the context it was given (an
// auth-token or config fetch) on the same connection, then fails locally
// without sending the call. The side RPC's events are not the try's: its
// InTrailer does not make the try look answered by its peer (an early
// review found they were booked to the try). But nothing the client sees
// tells this side RPC from the try itself sent under a method the
// interceptor renamed (TestRenamedTryIsMaybeSent): the
// try's own method never started and an RPC of another method may have
// been sent, so the try is maybe sent, never NOT_SENT — its outcome
// UNKNOWN and its grant held, the safe side (DESIGN.md §3.5: a try that may
// have run is not repeated without a query). A side RPC followed by the try
// itself leaves the try's own events to decide
// (TestAuditSideRPCWithTheSameRequestIsNotTheTry).
func TestSideRPCOfALaterInterceptorIsNotTheTry(t *testing.T) {
	leaf := &testsvc.Service{
		GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return &testingv1.GetResponse{}, nil
		},
		PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			return &testingv1.PutResponse{}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	fetchThenFail := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != testingv1.TestService_Get_FullMethodName {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		// The side RPC goes to what lies below this interceptor, as the
		// call itself would.
		_ = invoker(ctx, testingv1.TestService_Put_FullMethodName, &testingv1.PutRequest{}, &testingv1.PutResponse{}, cc)
		return grpcstatus.Error(codes.Unavailable, "auth: no token")
	}
	opts := append(interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1})),
		grpc.WithChainUnaryInterceptor(fetchThenFail))
	client := testingv1.NewTestServiceClient(end.DialT(t, opts...))

	ctx, err := interceptor.StartAttempt(t.Context(), 5, 10*time.Second)
	require.NoError(t, err)
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	require.Equal(t, status.KindUnknown, o.Kind, "the try may have been sent under another name: %v", err)
	require.ErrorContains(t, err, "auth: no token", "the interceptor's own error, not the side RPC's status")
	require.Equal(t, int64(5), snap.Held, "a try that may have been sent holds its grant")
}

// statsHandler.TagRPC hid the try's delivery record from any RPC whose
// method differs from the try's (the side-RPC fix). An interceptor below
// tollgate's that routes the call under another method name (a versioned or
// legacy path) was then never seen by the stats handler, and with
// DialOptions every failed try lacked OutHeader and was classified NOT_SENT:
// repeated without a query (found by review). A first fix recognised the
// renamed try by its request pointer, and missed a rename that sends a copy
// (proto.Clone, a v1->v2 conversion), found by a later review. An RPC of
// another method that may have been sent, while the try's own method never
// started, leaves the try maybe sent: UNKNOWN, the handler runs once,
// whatever the rename sends. A side RPC followed by the try itself is left
// to the try's own events (TestAuditSideRPCWithTheSameRequestIsNotTheTry).
func TestRenamedTryIsMaybeSent(t *testing.T) {
	for _, tc := range []struct {
		name string
		send func(req any) any
	}{
		{"the request itself", func(req any) any { return req }},
		{"a copy of the request", func(req any) any { return proto.Clone(req.(proto.Message)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			end := testsvc.StartT(t, testsvc.Bufconn, func(*grpc.Server) {},
				grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
					if m, _ := grpc.MethodFromServerStream(st); m != "/legacy.v0.Ledger/Apply" {
						return grpcstatus.Error(codes.Unimplemented, "no such service") // the owner's query
					}
					runs.Add(1)
					var m testingv1.ApplyRequest
					_ = st.RecvMsg(&m)
					return grpcstatus.Error(codes.Internal, "effect done, then failed")
				}))
			rewrite := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if method != testingv1.TestService_Apply_FullMethodName {
					return inv(ctx, method, req, reply, cc, opts...) // tollgate's own queries keep their names
				}
				return inv(ctx, "/legacy.v0.Ledger/Apply", tc.send(req), reply, cc, opts...)
			}
			opts := append(interceptor.DialOptions(), grpc.WithChainUnaryInterceptor(rewrite)) // below tollgate's
			c := testingv1.NewTestServiceClient(end.DialT(t, opts...))
			_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			o := status.OutcomeOf(err)
			require.Equal(t, int32(1), runs.Load(), "a sent try was classified NOT_SENT and repeated: %v", err)
			require.Equal(t, status.KindUnknown, o.Kind, "the try may have run: its outcome is unknown")
		})
	}
}

// NewClientInterceptors' state is shared by every ClientConn it is installed
// on, and so was the flag that the stats handler was seen at work: once seen
// on one conn, every try on a conn without the handler was "tracked" and,
// lacking OutHeader, classified NOT_SENT — a try that ran the handler and
// failed with a non-definite code was repeated without any query (found by
// review). The flag is now per connection: on the conn without the handler
// the try may have been sent, its outcome is UNKNOWN, the handler runs once.
func TestStatsSeenOnOneConnIsNotSeenOnAnother(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{
		GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return &testingv1.GetResponse{}, nil
		},
		ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			runs.Add(1) // the effect happened …
			return nil, grpcstatus.Error(codes.Internal, "… then the handler failed")
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register) // a plain server
	unary, stream, err := interceptor.NewClientInterceptors(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3}))
	require.NoError(t, err)
	// Conn A: interceptors and the stats handler, as the docs say.
	a := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithUnaryInterceptor(unary), grpc.WithStreamInterceptor(stream),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))
	// Conn B: the same interceptors, no stats handler (documented as "treated as maybe sent").
	b := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithUnaryInterceptor(unary), grpc.WithStreamInterceptor(stream),
		grpc.WithDisableRetry()))

	_, err = a.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)

	_, err = b.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k", Amount: 1})
	o := status.OutcomeOf(err)
	t.Logf("B.Apply: kind=%v reason=%v err=%v runs=%d", o.Kind, status.ReasonName(o.Reason), err, runs.Load())
	require.Equal(t, int32(1), runs.Load(), "a try that may have been sent was repeated without a query")
	require.Equal(t, status.KindUnknown, o.Kind)
}

// gateDeadlock bounds every wait: it only turns a deadlock into a failure.
const gateDeadlock = 30 * time.Second

func gateWait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(gateDeadlock)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("deadlock: no %s within %v", what, gateDeadlock)
	}
}

// tryOf returns the try named by the tollgate header of the try whose
// (client-side) stats context ctx is: its t field, 1 when absent (the
// header's default), "" without a header.
func tryOf(ctx context.Context) string {
	md, _ := metadata.FromOutgoingContext(ctx)
	vs := md.Get("tollgate")
	if len(vs) == 0 {
		return ""
	}
	for _, f := range strings.Split(vs[0], ";") {
		if strings.HasPrefix(f, "t=") {
			return f[2:]
		}
	}
	return "1"
}

// trailerGate is a client stats handler. Installed before tollgate's, it
// holds the transport's reader in HandleRPC(InTrailer) of try 1 until open
// is closed (a slow stats handler, e.g. an exporter, does the same).
// Installed after tollgate's, it reports when tollgate's handler has seen
// try 1's InTrailer.
type trailerGate struct {
	open  chan struct{} // nil: do not hold
	seen  chan struct{} // nil: do not report
	fired sync.Once
}

func (g *trailerGate) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (g *trailerGate) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (g *trailerGate) HandleConn(context.Context, stats.ConnStats) {}
func (g *trailerGate) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InTrailer); !ok || tryOf(ctx) != "1" {
		return
	}
	if g.open != nil {
		<-g.open
	}
	if g.seen != nil {
		g.fired.Do(func() { close(g.seen) })
	}
}

// TestLateTrailerOfAnEarlierTryDoesNotMarkTheNext: the transport reader
// delivers a try's InTrailer to the stats handlers before it closes the
// stream, so the client may stop waiting for try 1 (its per-try timeout)
// while try 1's trailer is still on its way to tollgate's handler. That
// trailer must not land in try 2's record: try 2, which never got an answer
// (the caller cancelled it), holds its grant (DESIGN.md §2.3, §3.3: "a call
// whose response never arrived counts its grant as spent until
// reconciled") instead of being settled with try 1's tollgate-spent. Each
// repeat has a delivery record of its own (found by an adversarial review;
// the unary owner once reused one record for every try of a call).
func TestLateTrailerOfAnEarlierTryDoesNotMarkTheNext(t *testing.T) {
	try2 := make(chan struct{})
	var try2Once sync.Once
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		a, _ := interceptor.AttemptFromContext(ctx)
		if a.Try == 1 {
			ledger, _ := budget.FromContext(ctx)
			require.NoError(t, ledger.Take())
			require.NoError(t, ledger.Take()) // try 1 reports tollgate-spent: 2
			return &testingv1.GetResponse{}, nil
		}
		try2Once.Do(func() { close(try2) })
		<-ctx.Done() // try 2 never answers: the caller gives up
		return nil, ctx.Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)

	hold := &trailerGate{open: make(chan struct{})}
	after := &trailerGate{seen: make(chan struct{})}
	var openOnce sync.Once
	openGate := func() { openOnce.Do(func() { close(hold.open) }) }
	t.Cleanup(openGate)
	opts := append([]grpc.DialOption{grpc.WithStatsHandler(hold)}, interceptor.DialOptions(
		interceptor.WithoutRetryBudget(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, PerTryTimeout: 300 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...)
	opts = append(opts, grpc.WithStatsHandler(after))
	client := testingv1.NewTestServiceClient(end.DialT(t, opts...))

	ctx, err := interceptor.StartAttempt(t.Context(), 10, 30*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(budget.WithGrant(ctx, 3))
	defer cancel()
	ledger, _ := budget.FromContext(ctx)

	done := make(chan struct{})
	var callErr error
	go func() {
		defer close(done)
		_, callErr = client.Get(ctx, &testingv1.GetRequest{})
	}()
	// Try 1 answered, but its trailer is held in the reader; the client's
	// per-try timeout ends it (no InTrailer seen: its grant of 3 is held)
	// and the owner sends try 2 (Get is NO_SIDE_EFFECTS).
	gateWait(t, try2, "try 2 at the server")
	openGate() // the reader now delivers try 1's trailer
	gateWait(t, after.seen, "try 1's InTrailer at tollgate's stats handler")
	cancel() // try 2 never gets an answer
	gateWait(t, done, "the call's end")
	require.Error(t, callErr)

	snap := ledger.Snapshot()
	require.Equal(t, budget.Snapshot{Total: 10, Free: 4, Held: 6, Origin: true}, snap,
		"neither try's answer arrived at the owner: both grants (3+3) are held, nothing is known spent")
}

// A gateway-style handler that forwards its callee's trailer with
// grpc.SetTrailer (grpc-go appends) makes its answer carry two tollgate-spent
// values. Such a trailer does not read, and was taken as absent: in lenient
// accounting an OK call without a report refunds the whole grant, so the
// origin refunded units that were spent and lent them again — more RPCs
// below the origin than the allowance (found by review). A report that does
// not read now holds the grant.
func TestUnreadableSpentTrailerHoldsTheGrant(t *testing.T) {
	var below atomic.Int32 // RPCs that arrived below the origin (dep and leaf)
	leaf := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		below.Add(1)
		return &testingv1.GetResponse{Value: "v"}, nil
	}}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	one := interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}) // each tier lends all it has
	leafClient := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions(one)...))
	dep := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		below.Add(1)
		return leafClient.Get(ctx, r) // spends 1 unit: dep reports tollgate-spent: 1
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions(one)...))
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		var tr metadata.MD
		resp, err := depClient.Get(ctx, r, grpc.Trailer(&tr))
		_ = grpc.SetTrailer(ctx, tr) // a gateway forwarding its upstream's trailer
		return resp, err
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(one)...))

	const allowance = 2
	ctx, err := interceptor.StartAttempt(t.Context(), allowance, 5*time.Second)
	require.NoError(t, err)
	ledger, _ := budget.FromContext(ctx)
	for i := range 3 {
		var tr metadata.MD
		_, err := origin.Get(ctx, &testingv1.GetRequest{Key: "k"}, grpc.Trailer(&tr))
		t.Logf("call %d: err=%v trailer tollgate-spent=%q ledger=%+v below=%d", i, err, tr.Get("tollgate-spent"), ledger.Snapshot(), below.Load())
	}
	require.LessOrEqual(t, below.Load(), int32(allowance), "RPCs below the origin exceed the attempt's allowance")
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// a5d7958: parsePushback now reads grpc-retry-pushback-ms with strconv.Atoi,
// which accepts up to 19 digits (the old reader refused more than 10, as "do
// not retry"). owner.proceed turns the value into a wait with
// time.Duration(ms)*time.Millisecond, which overflows past ~9.2e12 ms: a
// callee's "wait 317 years" (1e13 ms) wraps to a negative wait, and the call
// is retried at once instead of stopping (the wait passes the deadline).
func TestStatsPushbackWrap(t *testing.T) {
	for _, val := range []string{"9999999999 (control)", "10000000000000", "9223372036854775807"} {
		t.Run(val, func(t *testing.T) {
			v := val
			if v == "9999999999 (control)" {
				v = "9999999999"
			}
			runs, err := getPushedBack(t, v)
			require.Equal(t, int64(1), runs, "the callee asked for a wait of %s ms, far past any deadline; the call was retried (err %v)", v, err)
			require.Error(t, err)
		})
	}
}

// Regression (review 72): a client- or bidi-streaming call whose SendMsg
// fails locally (here a message over the caller's MaxCallSendMsgSize; grpc-go
// then ends the stream, resetting it at the server, after earlier messages
// were delivered and may have acted) ends with grpc-go's bare
// RESOURCE_EXHAUSTED: no tollgate detail, no attempt ID. DESIGN.md §2.5 names
// exactly this code ("grpc-go makes one on the client for an oversized …")
// as one a tollgate client classifies UNKNOWN, and §3.6 / owner.conclude
// promise the caller a typed UNKNOWN naming the attempt, never a bare code a
// generic retry policy repeats. The unary path types the same failure.
func TestStreamLocalSendErrorIsTyped(t *testing.T) {
	received := make(chan string, 4)
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		return eachChat(st, func(m *testingv1.ChatRequest) error {
			received <- m.GetValue() // the effect of a message
			return nil
		})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	conn := end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1024)))...)
	client := testingv1.NewTestServiceClient(conn)
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(ctx)

	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{Value: "small"}))
	require.Equal(t, "small", <-received, "the first message reached the handler: an effect may have happened")
	sendErr := st.Send(&testingv1.ChatRequest{Value: strings.Repeat("x", 4096)})
	require.Error(t, sendErr)
	_, err = st.Recv()
	require.Error(t, err)
	require.NotEqual(t, codes.ResourceExhausted, grpcstatus.Code(err), "an UNKNOWN is never RESOURCE_EXHAUSTED (DESIGN.md §2.5): a generic policy would repeat it")

	for _, c := range []struct {
		name string
		e    error
	}{{"Recv", err}, {"Send", sendErr}} {
		name, e := c.name, c.e
		o := status.OutcomeOf(e)
		require.Equal(t, status.KindUnknown, o.Kind, "%s: %v", name, e)
		require.NotNil(t, o.Detail, "%s: a tollgate client returns a typed UNKNOWN naming the attempt, not a bare RESOURCE_EXHAUSTED: %v", name, e)
		require.Equal(t, a.ID, o.Detail.GetAttemptId(), name)
	}
}

// The unary counterpart, for comparison: the same local failure is typed.
func TestUnaryLocalSendErrorIsTyped(t *testing.T) {
	svc := &testsvc.Service{}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	conn := end.DialT(t, append(interceptor.DialOptions(fastRetry(1)),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1024)))...)
	client := testingv1.NewTestServiceClient(conn)
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: strings.Repeat("x", 4096)})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "%v", err)
}

// expiredCreds is a grpc.PerRPCCredentials whose token cannot be had: it
// answers UNAUTHENTICATED, which grpc-go (gRFC A54) passes to the caller.
type expiredCreds struct{ calls *atomic.Int64 }

func (c expiredCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	c.calls.Add(1)
	return nil, grpcstatus.Error(codes.Unauthenticated, "token expired")
}
func (expiredCreds) RequireTransportSecurity() bool { return false }

// With grpc.PerRPCCredentials that fail with UNAUTHENTICATED, grpc-go
// returns UNAUTHENTICATED once. tollgate classifies every error of a try
// without OutHeader as NOT_SENT whatever its code (status.OutcomeOfCall),
// repeats the call MaxTries times (the credentials are asked three
// times) and returns UNAVAILABLE: status.Code and status.FromError no longer
// show the caller that its credentials failed, and any UNAVAILABLE retry
// above repeats the hopeless call again. The same happens to a definite
// error an interceptor chained below tollgate returns without sending
// (INVALID_ARGUMENT from a request validator).
func TestClientCredsNotSent(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))

	var calls atomic.Int64
	_, err := client.Get(t.Context(), &testingv1.GetRequest{}, grpc.PerRPCCredentials(expiredCreds{&calls}))
	require.Equal(t, codes.Unauthenticated, grpcstatus.Code(err), "the credentials' code, as grpc-go returns it: %v", err)
	require.Equal(t, int64(1), calls.Load(), "a definite local failure is not repeated")

	validate := func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
		return grpcstatus.Error(codes.InvalidArgument, "request invalid")
	}
	inner := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithChainUnaryInterceptor(validate))...))
	_, err = inner.Get(t.Context(), &testingv1.GetRequest{})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "an inner interceptor's definite error: %v", err)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// 10e4f2f made a try that never left the client with a definite code FAILED
// (status.OutcomeOfCall), and decide returns FAILED without conclude, so the
// call's doubt is ignored: an IDEMPOTENT call whose first try reached the
// handler and timed out (UNKNOWN) is repeated at a callee without records,
// and when the repeat fails locally (an inner interceptor's
// INVALID_ARGUMENT, or credentials refused UNAUTHENTICATED) the call ends
// FAILED, "a definite error" (README: FAILED only without the effect), though
// try 1 may have had its effect. DESIGN.md §3.5: "A call's outcome combines
// all its tries"; before 10e4f2f the never-sent repeat was NOT_ADMITTED and
// conclude made it UNKNOWN.
func TestNotSentDoubt(t *testing.T) {
	var ran atomic.Int64
	svc := &testsvc.Service{PutFunc: func(ctx context.Context, _ *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		ran.Add(1)
		<-ctx.Done() // outlives the client's per-try timeout: try 1's outcome is UNKNOWN
		return nil, ctx.Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...) // no store: no records
	var puts atomic.Int64
	validate := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/tollgate.testing.v1.TestService/Put" && puts.Add(1) > 1 {
			return grpcstatus.Error(codes.InvalidArgument, "request invalid") // never sent
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(
		interceptor.WithoutRetryBudget(),
		// Try 1 must reach the handler within its timeout: 100 ms was
		// once too short on a loaded machine.
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 400 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})),
		grpc.WithChainUnaryInterceptor(validate))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
	require.NoError(t, err)
	_, err = client.Put(ctx, &testingv1.PutRequest{})
	require.Equal(t, int64(1), ran.Load(), "try 1 reached the handler")
	require.GreaterOrEqual(t, puts.Load(), int64(2), "the call was repeated (IDEMPOTENT at a callee without records)")
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind,
		"try 1 ran and its outcome is unknown, yet the call ended %v (%v)", o.Kind, err)
}

// A review (hunting a flaky test) found the defect this test guards against
// (fixed since; the text below is its account of the code before the fix).
//
// DESIGN.md §3.5: "A call's outcome combines all its tries: once any try was
// UNKNOWN, ... only a finished record or a FENCED answer can end the call
// NOT_ADMITTED." For a NO_SIDE_EFFECTS method the owner repeats an UNKNOWN
// try without setting its doubt, so a later refusal (here CONCURRENCY_FULL:
// try 1 still holds the only slot) ends the call NOT_ADMITTED and gives the
// grant back, although try 1 reached the handler and its response never
// arrived (TestALostResponseHoldsTheGrant's expectation; that test flaked on
// this when a loaded machine made the last try's preparation find no time).
func TestOutcomeNoSideEffectsDoubt(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	release, entered := make(chan struct{}), make(chan struct{}, 4)
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		entered <- struct{}{}
		<-release
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithoutRetryBudget(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 200 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 6, 10*time.Second)
	require.NoError(t, err)
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	close(release)
	require.Len(t, entered, 1, "try 1 reached the handler; later tries were refused by admission")
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "try 1 ran and its response never arrived, yet the call ended %v", err)
	l, _ := budget.FromContext(ctx)
	require.Equal(t, int64(6), l.Snapshot().Held, "the grant of a try whose response never arrived stays held")
}

func requireClosing(t *testing.T, err error) {
	t.Helper()
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonNotSent, o.Reason, "%v", err)
	require.Equal(t, codes.Unavailable, grpcstatus.Code(err))
	require.Contains(t, err.Error(), "the client connection is closing")
}

// A review found that a call on a ClientConn the caller had closed was
// repeated: grpc-go fails it at once with grpc.ErrClientConnClosing and
// never repeats it, but tollgate's owner saw no OutHeader, classified the
// try NOT_SENT and repeated it on the shut-down connection, with backoff,
// until MaxTries. It now ends after the one try, NOT_ADMITTED NOT_SENT (the
// code tollgate gives every call that never left the client) with
// grpc-go's message. Unary and stream alike.
func TestClientClosedConn(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	var tries atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		tries.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cc := end.DialT(t, append(interceptor.DialOptions(fastRetry(3)), grpc.WithChainUnaryInterceptor(count))...)
	client := testingv1.NewTestServiceClient(cc)
	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	require.NoError(t, cc.Close())

	tries.Store(0)
	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	requireClosing(t, err)
	require.Equal(t, int64(1), tries.Load(), "a call on a closed ClientConn is not repeated")

	start := time.Now()
	_, err = client.Watch(t.Context(), &testingv1.WatchRequest{})
	requireClosing(t, err)
	require.Less(t, time.Since(start), 100*time.Millisecond, "a stream on a closed ClientConn waits no backoff")
}

// A review found that a server's error of a code that is not definite
// (ABORTED here; the same for UNAVAILABLE, RESOURCE_EXHAUSTED, INTERNAL, ...) becomes an UNKNOWN
// outcome on a tollgate client (DESIGN.md §2.5) and keeps its code, but
// status.OutcomeUnknown built the status callers read with
// grpc/status.FromError (and status.Convert) from tollgate's own details
// only: the server's google.rpc details (an ErrorInfo naming the
// conflict, a QuotaFailure, a BadRequest...) were gone, and
// FromError stops at tollgate's error, so the wrapped cause is out of reach
// of the grpc API. With grpc-go alone, FromError(err).Details() has them;
// they now follow tollgate's own (but an ErrorInfo, of which a status
// carries one, tollgate's, and a RetryInfo).
func TestClientServerDetailsKept(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		st, err := grpcstatus.New(codes.Aborted, "version conflict").WithDetails(&errdetails.PreconditionFailure{
			Violations: []*errdetails.PreconditionFailure_Violation{{Type: "VERSION", Subject: "ledger.example.com/k"}},
		})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}}
	// A callee that does not speak tollgate (the README: such a callee's
	// error is typed UNKNOWN on the client): tollgate's server interceptor,
	// which rewrites a handler's ABORTED the same way, is left out.
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)

	hasConflict := func(err error) bool {
		st, _ := grpcstatus.FromError(err)
		for _, d := range st.Details() {
			if pf, ok := d.(*errdetails.PreconditionFailure); ok && len(pf.GetViolations()) == 1 &&
				pf.GetViolations()[0].GetSubject() == "ledger.example.com/k" {
				return true
			}
		}
		return false
	}
	plain := testingv1.NewTestServiceClient(end.DialT(t))
	_, err := plain.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	require.True(t, hasConflict(err), "grpc-go alone: %v", err)

	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	require.Equal(t, codes.Aborted, grpcstatus.Code(err), "the code is kept: %v", err)
	require.True(t, hasConflict(err), "the server's PreconditionFailure is lost from status.FromError(err).Details(): %v", err)
}

// A review found that grpc.OnFinish promises its callback "will only be called
// once by gRPC", with the status of the RPC; interceptors above tollgate's
// (metrics, in-flight gauges) add it to learn when the call they see ends.
// owner.run passes the caller's call options to every try (owner.go:185),
// so the callback runs once per try, the first time with the refusal of a
// try the caller never sees, while the call goes on. queryOptions drops
// OnFinish for resolution queries, for that very reason; tries keep it.
func TestClientOnFinishRunsOncePerCall(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if runs.Add(1) == 1 {
			return nil, shed() // without effect: repeated
		}
		return &testingv1.ApplyResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	var mu sync.Mutex
	var finished []error
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1}, grpc.OnFinish(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		finished = append(finished, err)
	}))
	require.NoError(t, err)
	require.Equal(t, int64(2), runs.Load(), "repeated once")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, finished, 1, "OnFinish ran per try: %v", finished)
	require.NoError(t, finished[0], "with the call's status")
}

// A stream's OnFinish runs once too, when the stream ends, with its result
// (nil for OK): not when a try that was repeated ended.
func TestClientStreamOnFinishRunsOncePerCall(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		if runs.Add(1) == 1 {
			return shed() // before any message: repeated
		}
		return ss.Send(&testingv1.WatchResponse{})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	var mu sync.Mutex
	var finished []error
	st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "k"}, grpc.OnFinish(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		finished = append(finished, err)
	}))
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	_, err = st.Recv()
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, int64(2), runs.Load(), "repeated once")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, finished, 1, "OnFinish ran per try: %v", finished)
	require.NoError(t, finished[0], "with the stream's status")
}

// The README promises that grpc.OnFinish "runs once, as grpc-go promises,
// when the call or stream ends, with its result". grpc-go (v1.85
// newClientStream's deferred endOfClientStream) runs OnFinish even when the
// RPC fails before a stream exists. tollgate's unary and stream interceptors
// return newCall's local refusal (a bad WithCallKey name: MALFORMED_HEADER;
// CALL_KEY_REQUIRED in an IDEMPOTENT handler) before they take the OnFinish
// options out, and never run them: an outer interceptor's in-flight gauge
// or a tracing span that ends in OnFinish stays open for good.
func TestClientOnFinishLocalRefusal(t *testing.T) {
	svc := &testsvc.Service{PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		return &testingv1.PutResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	ctx := interceptor.WithCallKey(t.Context(), "not a valid name!")

	var unary, stream atomic.Int64
	_, err := client.Put(ctx, &testingv1.PutRequest{Key: "k"}, grpc.OnFinish(func(error) { unary.Add(1) }))
	require.Error(t, err)
	_, err = client.Chat(ctx, grpc.OnFinish(func(error) { stream.Add(1) }))
	require.Error(t, err)
	require.Equal(t, int64(1), unary.Load(), "unary OnFinish runs once for a call refused locally")
	require.Equal(t, int64(1), stream.Load(), "stream OnFinish runs once for a stream refused locally")
}

// TestTargetCacheKeepsNoClosedConn: DialOptions built once and kept (to
// dial again, or in a pool's config) must not keep alive a ClientConn that
// was closed and dropped. The client remembers its last target by name,
// not by connection (an adversarial review found the first version of the
// cache holding the *grpc.ClientConn, with its balancer and resolver).
func TestTargetCacheKeepsNoClosedConn(t *testing.T) {
	leaf := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	opts := interceptor.DialOptions() // kept, as a pool keeps its dial config

	gone := func() weak.Pointer[grpc.ClientConn] {
		conn, err := end.Dial(opts...)
		require.NoError(t, err)
		_, err = testingv1.NewTestServiceClient(conn).Get(t.Context(), &testingv1.GetRequest{})
		require.NoError(t, err)
		require.NoError(t, conn.Close())
		return weak.Make(conn)
	}()
	require.Eventually(t, func() bool {
		runtime.GC()
		return gone.Value() == nil
	}, 10*time.Second, 10*time.Millisecond, "the closed, dropped ClientConn is still reachable")
	runtime.KeepAlive(opts)
}

package interceptor_test

import (
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// TestHugeInitialBackoffIsRefusedOrHarmless: RetryPolicy.withDefaults
// now gives MaxBackoff the value of an InitialBackoff set above 1 s, so a
// policy that sets only InitialBackoff: math.MaxInt64 ("as long as it takes")
// passes validation (before today it was refused: max backoff 1 s below
// initial). At the first repeat, backoff computes rand.N(ceiling+1) with
// ceiling = MaxInt64: the +1 overflows and rand.N panics in the caller's
// goroutine. Either NewDialOptions refuses the policy, or a repeat does not
// panic.
func TestHugeInitialBackoffIsRefusedOrHarmless(t *testing.T) {
	p := interceptor.RetryPolicy{InitialBackoff: math.MaxInt64}
	opts, err := interceptor.NewDialOptions(interceptor.WithRetry(p))
	if err != nil {
		require.ErrorIs(t, err, interceptor.ErrInvalidOption)
		return // refused at construction: fine
	}
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull) // not final: the owner may repeat
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) })
	client := testingv1.NewTestServiceClient(end.DialT(t, opts...))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NotPanics(t, func() {
		_, err = client.Get(ctx, &testingv1.GetRequest{Key: "k"})
	}, "a policy NewDialOptions accepted panics at its first repeat")
	require.Error(t, err)
}

// TestZeroAllowanceOriginStillRepeatsALeafCall: the
// allowance counts RPCs sent *below* the origin; the origin's own tries are
// not charged (client.go prepare), and WithAllowance documents that "0 lets
// no call below the origin be sent" — not that the origin may not repeat.
// Yet prepare refuses every repeat of the origin with ALLOWANCE_EXHAUSTED,
// final, when the ledger's spent units reach its total, which with an
// allowance of 0 is always: MaxTries is silently 1 for a leaf call that
// needs no unit, and a transient refusal (SHED, without effect) is
// returned final.
func TestZeroAllowanceOriginStillRepeatsALeafCall(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{
		GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			if runs.Add(1) == 1 {
				return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonShed))
			}
			return &testingv1.GetResponse{Value: "v"}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithAllowance(0),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}),
	)...)
	_, err := testingv1.NewTestServiceClient(conn).Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	require.NoError(t, err, "a leaf call that needs no unit is repeated under MaxTries 3; outcome %v", status.OutcomeOf(err).Reason)
	require.Equal(t, int64(2), runs.Load())
}

// TestSpendEventsOfNeverSentTriesAreNotReturned: a middle tier (below the
// origin) calls a dependency it cannot reach, so every try fails before its
// request leaves the client (no OutHeader: NOT_SENT). The ledger takes a
// unit for each try and gives it back (Unsend), so nothing was spent and the
// dependency received nothing; but each try's tollgate.allowance.spend event
// was recorded with units=1 before the try was sent, and no event or
// attribute corrects it. The spend events then add up to units the
// dependency never received (TestTelemetryOneAttemptOnEverySpanAndSpendAddsUp
// states that they must add up to the calls it received), and disagree with
// the span's own tollgate.allowance.spent.
func TestSpendEventsOfNeverSentTriesAreNotReturned(t *testing.T) {
	tp, spans := testTracer(t)

	// The dependency is unreachable.
	dep := unreachable(t, interceptor.WithClientTracerProvider(tp))

	var depErr error
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		_, depErr = dep.Get(ctx, r)
		return &testingv1.GetResponse{Value: "v"}, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithAllowance(8), interceptor.WithAttemptTimeout(10*time.Second))...))

	_, err := origin.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	require.Error(t, depErr)
	require.Equal(t, status.ReasonNotSent, status.OutcomeOf(depErr).Reason, "precondition: the dependency's tries were never sent: %v", depErr)

	var midSpan *tracetest.SpanStub
	for i, s := range spans.GetSpans() {
		if s.Name == "tollgate.call" {
			midSpan = &spans.GetSpans()[i]
		}
	}
	require.NotNil(t, midSpan, "the middle tier's tollgate.call span")
	var units, tries int64
	for _, e := range midSpan.Events {
		if e.Name == "tollgate.allowance.spend" {
			tries++
			u, ok := attr(e.Attributes, "units")
			require.True(t, ok)
			units += u.AsInt64()
		}
	}
	spent, ok := attr(midSpan.Attributes, "tollgate.allowance.spent")
	require.True(t, ok)
	require.Equal(t, int64(0), spent.AsInt64(), "precondition: the ledger spent nothing (every unit came back)")
	require.Equal(t, int64(3), tries, "precondition: three tries were prepared")
	require.Equal(t, spent.AsInt64(), units,
		"the spend events of tries that were never sent add up to %d units, yet the dependency received nothing and the span says %d were spent",
		units, spent.AsInt64())
}

// TestNeverSentTriesCountedAsSentTries: tollgate.client.tries is
// documented as "Tries sent by tollgate's client interceptor" and client.record
// says "Local refusals sent nothing and are not counted". A try that grpc-go
// failed before its request left the client (no OutHeader: NOT_SENT, which
// the client itself proves) sent nothing either, yet each one is counted as
// a sent try (outcome not_admitted), indistinguishable from a server's
// refusal.
func TestNeverSentTriesCountedAsSentTries(t *testing.T) {
	mp, reader := testMeter(t)
	_, err := unreachable(t, interceptor.WithClientMeterProvider(mp)).Get(t.Context(), &testingv1.GetRequest{})
	require.Equal(t, status.ReasonNotSent, status.OutcomeOf(err).Reason, "precondition: never sent: %v", err)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, int64(0), counter(rm, "tollgate.client.tries"),
		"three tries that provably never left the client are counted as sent tries")
}

// unreachable returns a tollgate client (three tries, no retry budget, and
// opts) of a server no connection reaches: grpc-go fails each of its RPCs
// (not wait-for-ready) before any header is sent.
func unreachable(t *testing.T, opts ...interceptor.ClientOption) testingv1.TestServiceClient {
	conn, err := grpc.NewClient("passthrough:///unreachable",
		append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
				return nil, errors.New("unreachable")
			}),
		}, interceptor.DialOptions(append([]interceptor.ClientOption{
			interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
			interceptor.WithoutRetryBudget(),
		}, opts...)...)...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return testingv1.NewTestServiceClient(conn)
}

// TestRetryEventNamesTheTryAboutToBeSent: an explicitly keyed call's
// first try is refused ATTEMPT_FENCED through try 5, so the owner continues
// at try 6 (DESIGN.md §2.2: the ballot jump does not count against its
// tries). The tollgate.retry event (try, reason, delay) is recorded with
// try = the count of tries the policy has used + 1 (here 1) — the number
// client.wait was given for the backoff — not the number of the try it
// announces, which the header, the spend event and the span all call 6.
func TestRetryEventNamesTheTryAboutToBeSent(t *testing.T) {
	tp, spans := testTracer(t)

	var calls atomic.Int32
	// A plain server (no tollgate interceptor) answers the refusal as given.
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if calls.Add(1) == 1 {
			return nil, status.NotAdmitted(status.ReasonAttemptFenced, status.Fields{Try: 1, FencedThroughTry: 5})
		}
		return &testingv1.GetResponse{Value: "v"}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
		interceptor.WithoutRetryBudget(),
		interceptor.WithClientTracerProvider(tp))...))
	_, err := client.Get(interceptor.WithCallKey(t.Context(), "reserve"), &testingv1.GetRequest{})
	require.NoError(t, err)

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
		case "tollgate.retry": // tollgate.try (DESIGN.md §5 says try: renamed as the other events name it), reason, delay
			v, _ := attr(e.Attributes, "tollgate.try")
			retryTries = append(retryTries, v.AsInt64())
		}
	}
	final, _ := attr(span.Attributes, "tollgate.try")
	require.Equal(t, []int64{1, 6}, spendTries, "precondition: tries 1 and 6 were sent")
	require.Equal(t, int64(6), final.AsInt64(), "precondition: the span ends at try 6")
	require.Equal(t, []int64{6}, retryTries, "the tollgate.retry event must name the try it announces")
}

// A review found that the owner took a retry-budget token before it knew
// whether the repeat's backoff fitted the deadline: a refusal whose
// retry-after outlasted the attempt spent a token on a repeat never sent.
// Here the budget holds one token and earns none; the first call's refusal
// asks for an hour, and the second call's refusal for a millisecond: the
// second call's repeat must still find its token.
func TestNoRetryTokenForARepeatThatCannotFit(t *testing.T) {
	var calls atomic.Int32
	svc := &testsvc.Service{GetFunc: func(_ context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		n := calls.Add(1)
		switch {
		case r.GetKey() == "far":
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Hour))
		case n == 2: // the second call's first try
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3),
		interceptor.WithAttemptTimeout(2*time.Second),
		interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1)))...))

	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "far"})
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "%v", err)
	_, err = client.Get(t.Context(), &testingv1.GetRequest{Key: "near"})
	require.NoError(t, err, "the repeat found the budget's one token")
	require.EqualValues(t, 3, calls.Load())
}

// A review found that a repeat the allowance could not pay for was never
// sent, yet the owner withdrew its retry-budget token (and slept its
// backoff) before it found out. The per-target budget bounds repeats sent
// (README: "repeats and resolutions cost a token"); a token burned for a
// repeat that never left the client is taken from other attempts to the
// same target, which then cannot repeat.
//
// mid's client to leaf has a retry budget of exactly one token that never
// refills. Attempt A reaches mid with 1 unit: its call to leaf takes it, is
// refused QUEUE_FULL, and cannot be repeated (no unit) — leaf sees one
// call. Attempt B reaches mid with 5 units; its first try is refused, and
// its repeat (which the unused token pays for) must be sent.
func TestRetryToken(t *testing.T) {
	var leafCalls, flaky atomic.Int64
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		leafCalls.Add(1)
		if r.GetKey() == "busy" || (r.GetKey() == "flaky" && flaky.Add(1) == 1) {
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.Fields{Message: "leaf is busy"})
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	toLeaf := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
		interceptor.WithRetryBudget(budget.WithMaxRetryTokens(1), budget.WithMinRetriesPerSecond(0), budget.WithRetryRatio(0)),
	)...))
	var (
		mu      sync.Mutex
		midErrs = map[string]error{}
	)
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		_, err := toLeaf.Get(ctx, r)
		mu.Lock()
		midErrs[r.GetKey()] = err
		mu.Unlock()
		if err != nil {
			return nil, err
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	dial := func(units int64) testingv1.TestServiceClient {
		return testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(
			interceptor.WithAllowance(units), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	}

	_, _ = dial(1).Get(t.Context(), &testingv1.GetRequest{Key: "busy"})
	require.Equal(t, int64(1), leafCalls.Load(), "attempt A had one unit below mid: one call reached leaf, no repeat was sent")
	require.Equal(t, status.ReasonAllowanceExhausted, status.OutcomeOf(midErrs["busy"]).Reason)

	_, err := dial(5).Get(t.Context(), &testingv1.GetRequest{Key: "flaky"})
	mu.Lock()
	berr := midErrs["flaky"]
	mu.Unlock()
	require.NoError(t, berr, "attempt B's repeat was refused: the only retry token went to attempt A's repeat, which was never sent")
	require.NoError(t, err)
}

// A review found that the interceptor's ALLOWANCE_EXHAUSTED refusal on a
// sealed ledger reported its free units as remaining. A goroutine that
// outlives its handler finds the handler's ledger sealed; the ledger's own
// refusal (budget.Allowance.Take) leaves units_remaining out, since those
// units went back to the caller with tollgate-spent, but the interceptor's
// said they remained, beside a message saying no unit was free: a caller
// reading units_remaining was told a repeat could be paid for when no take
// on this ledger can ever succeed again.
func TestSealedRemaining(t *testing.T) {
	leaf := &testsvc.Service{GetFunc: okGet}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	toLeaf := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions()...))
	ledgerErr := make(chan error, 1)
	callErr := make(chan error, 1)
	released := make(chan struct{})
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		go func() {
			<-released // the handler answered: its ledger is sealed
			l, _ := budget.FromContext(ctx)
			ledgerErr <- l.Take()
			_, err := toLeaf.Get(ctx, r)
			callErr <- err
		}()
		return &testingv1.GetResponse{}, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(interceptor.WithAllowance(5))...))
	_, err := origin.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	close(released)

	lo := status.OutcomeOf(<-ledgerErr)
	require.Equal(t, status.ReasonAllowanceExhausted, lo.Reason)
	require.Zero(t, lo.Detail.GetUnitsRemaining(), "the sealed ledger's own refusal reports no unit remaining")
	co := status.OutcomeOf(<-callErr)
	require.Equal(t, status.ReasonAllowanceExhausted, co.Reason)
	require.Zero(t, co.Detail.GetUnitsRemaining(),
		"the interceptor's refusal on the same sealed ledger reports units remaining: %v", co.Detail)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// c98709a's unpayable says, below the origin, that a repeat is "sure to be
// refused whatever happens meanwhile" once no unit is free, reserved or held.
// But a unit taken by a sibling call's try still in flight is counted spent,
// and comes back (Allowance.Unsend) when that try turns out never sent. The
// owner now refuses the repeat ALLOWANCE_EXHAUSTED at once, where it used to
// wait its backoff and find the unit back in prepare.
//
// mid has 2 units. Call B takes one, then an inner interceptor fails it
// before it is sent (INVALID_ARGUMENT: FAILED, not repeated; its unit goes
// back). Call A takes the other; leaf refuses its first try QUEUE_FULL
// (retryable). When A decides on its repeat, B is still in flight (free 0,
// reserved 0, held 0): unpayable refuses A, although B's unit is free again
// well before the retry-after leaf asked for (400 ms) ended.
func TestUnpayableSiblingUnsend(t *testing.T) {
	var aTries atomic.Int64
	aReached := make(chan struct{})
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if r.GetKey() == "a" && aTries.Add(1) == 1 {
			close(aReached)
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.Fields{Message: "leaf is busy", RetryAfter: 400 * time.Millisecond})
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	bInside := make(chan struct{})
	inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*testingv1.GetRequest); ok && r.GetKey() == "b" {
			close(bInside)
			<-aReached
			time.Sleep(100 * time.Millisecond) // A has decided on its repeat by now
			return grpcstatus.Error(codes.InvalidArgument, "inner: refused before sending")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	toLeaf := testingv1.NewTestServiceClient(leafEnd.DialT(t, append(interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	), grpc.WithChainUnaryInterceptor(inner))...))

	var aErr, bErr error
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		var wg sync.WaitGroup
		wg.Go(func() { _, bErr = toLeaf.Get(ctx, &testingv1.GetRequest{Key: "b"}) })
		<-bInside // B took its unit
		_, aErr = toLeaf.Get(ctx, &testingv1.GetRequest{Key: "a"})
		wg.Wait()
		return &testingv1.GetResponse{Value: "ok"}, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithAllowance(2), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	_, err := origin.Get(t.Context(), &testingv1.GetRequest{Key: "mid"})
	require.NoError(t, err)
	require.Equal(t, status.KindFailed, status.OutcomeOf(bErr).Kind, "precondition: B failed before it was sent: %v", bErr)
	require.NoError(t, aErr, "A's repeat was refused at once (%v), though the unit B never sent came back before A's backoff ended", aErr)
	require.Equal(t, int64(2), aTries.Load())
}

// policyStore is a third-party store that tells its policy (WithAttemptStore:
// "a store that tells its policy (a Policy() idempotency.Policy method …) is
// checked"), here one whose policy was never filled in beyond its skew.
type policyStore struct {
	*idempotency.MemoryStore
	pol idempotency.Policy
}

func (s policyStore) Policy() idempotency.Policy { return s.pol }

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// 48aa2a2 lowers the default maximum attempt time to the store policy's
// MaxAttemptDeadline. validate() checks maxAttemptTime ∈ (0, 24h] before
// that lowering, and nothing checks the lowered value, nor the policy
// (idempotency.Policy.Validate exists but is not called): a store whose policy
// says MaxAttemptDeadline 0 (or negative) makes a server whose maximum
// attempt time is 0. Before 48aa2a2 that configuration was refused
// ErrInvalidOption ("maximum attempt time 30s exceeds the attempt store's
// policy MaxAttemptDeadline 0s"); now NewServerOptions accepts it, and every
// request without an earlier deadline is given one of now + skew
// (DESIGN.md §3.1: "a request with no deadline gets the server's maximum").
func TestOptionsZeroPolicy(t *testing.T) {
	store := policyStore{MemoryStore: memoryStore(t), pol: idempotency.Policy{Skew: 0}}
	_, err := interceptor.NewServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0))
	require.Error(t, err, "a store policy with MaxAttemptDeadline 0 gave the server a maximum attempt time of 0")
	require.True(t, errors.Is(err, interceptor.ErrInvalidOption), "%v", err)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// parsePushback claims to read grpc-retry-pushback-ms "as grpc-go does",
// but grpc-go reads each value with strconv.Atoi (stream.go shouldRetry:
// err != nil || sp < 0 means do not retry), which accepts a sign ("+5",
// "-0") and leading zeros past 10 characters ("000000000005"). tollgate
// reads these as "do not retry" and ends the call after one try, where
// grpc-go's own retry would repeat it after 5 ms. (The shed refusal is one
// the owner repeats without the trailer: see the control subtest.)
func TestClientPushbackPlus(t *testing.T) {
	for _, v := range []string{"5 (control)", "+5", "-0", "000000000005"} {
		t.Run(v, func(t *testing.T) {
			val := v
			if val == "5 (control)" {
				val = "5"
			}
			runs, err := getPushedBack(t, val)
			require.NoError(t, err, "grpc-go reads pushback %q as a delay of %s and retries; tollgate stopped after %d try", val, "5 ms", runs)
			require.Equal(t, int64(2), runs)
		})
	}
}

// getPushedBack sends one Get, under a policy of three tries, to a server
// whose first run refuses it without effect with grpc-retry-pushback-ms
// pushback and whose later runs answer; it returns the runs and the call's
// error.
func getPushedBack(t *testing.T, pushback string) (int64, error) {
	t.Helper()
	var runs atomic.Int64
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if runs.Add(1) == 1 {
			_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", pushback))
			return nil, shed()
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	return runs.Load(), err
}

// TestExplicitKeyUnverifiableCarriesNoRetryAfter: the young-horizon
// refusal carries a retry-after only where a new attempt is known to be the
// right next step — the first try of a per-run key, which nobody else can
// have sent (records.go beforeHorizon: "A later try carries none: its earlier
// tries' outcome is unknown"; README: "with a retry-after ... on the first try
// of a numbered key"). Try 1 of an explicitly keyed call (WithCallKey) is
// exactly such a try whose earlier sending (by an earlier run of the handler)
// may have run: the server answers it UNKNOWN, final, and the owner returns
// that UNKNOWN as it is. It must not suggest a delay after which to go again,
// as it does not for try 2 — yet it does, since beforeHorizon looks only at
// the try number.
func TestExplicitKeyUnverifiableCarriesNoRetryAfter(t *testing.T) {
	const skew = time.Minute // a new attempt is certainly inside the window
	p := idempotency.DefaultPolicy()
	p.Skew = skew
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	ledger := newLedger(nil)
	end := mintedServer(t, &ledger.Service, store, interceptor.WithClockSkew(skew), interceptor.WithTrustedPeer(interceptor.TrustAll))

	// Through the owner: an explicit key's first try.
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
	require.NoError(t, err)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	_, err = client.Apply(interceptor.WithCallKey(ctx, "reserve-stock"), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "an explicit key's first try may have been sent by an earlier run: %v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
	require.Zero(t, ledger.effects.Load())
	ra, ok := status.RetryAfter(err)
	require.False(t, ok, "an UNKNOWN outcome (earlier sending of the key may have run) suggests a delay of %v to go again", ra)

	// Raw, as a trusted peer sends it: the server itself attaches it.
	a, _ := interceptor.AttemptFromContext(ctx)
	raw := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
		"a="+a.ID+";c=0.reserve-stock;t=1;d="+itoa(a.Deadline.UnixMilli()))
	_, err = testingv1.NewTestServiceClient(end.DialT(t)).Apply(raw, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o = status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	ra, ok = status.RetryAfter(err)
	require.False(t, ok, "server: explicit key try 1 refused UNKNOWN with retry-after %v", ra)
}

// TestRetryAfterLetsALaggingPeersNewAttemptPass: the young-horizon
// refusal's retry-after is documented as the time until a newly created
// attempt is verifiable ("a new attempt can succeed once the refusal's
// retry-after has passed"). The store measures a new attempt by the
// creating peer's clock (its UUIDv7 time), and DESIGN.md §3.1 lets a
// trusted peer's clock be up to the skew off the server's: a retry-after
// of horizon + skew − now by the server's clock let a peer whose clock lags
// by most of the skew, waiting exactly the retry-after, create an attempt
// that was refused again. The peer here waits the retry-after for real (the
// skew is small), then creates its attempt by its lagging clock.
func TestRetryAfterLetsALaggingPeersNewAttemptPass(t *testing.T) {
	const skew = 200 * time.Millisecond
	const lag = skew * 9 / 10 // within the skew DESIGN.md §3.1 allows
	p := idempotency.DefaultPolicy()
	p.Skew = skew
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	ledger := newLedger(nil)
	end := mintedServer(t, &ledger.Service, store, interceptor.WithClockSkew(skew), interceptor.WithTrustedPeer(interceptor.TrustAll))
	client := testingv1.NewTestServiceClient(end.DialT(t))
	send := func(id string) error {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
			"a="+id+";t=1;d="+itoa(time.Now().Add(10*time.Second).UnixMilli()))
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
		return err
	}

	// The peer's first attempt, created (by its lagging clock) just now.
	err = send(storetest.AttemptIDAt(time.Now().Add(-lag)))
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason, "%v", err)
	wait, ok := status.RetryAfter(err)
	require.True(t, ok, "a first try's young-horizon refusal carries a retry-after: %v", err)

	// It waits the retry-after and creates a new attempt by its clock.
	time.Sleep(wait)
	err = send(storetest.AttemptIDAt(time.Now().Add(-lag)))
	require.NoError(t, err, "a new attempt created after the retry-after (%v) by a peer %v behind, inside the skew %v",
		wait, lag, skew)
	require.Equal(t, int64(1), ledger.effects.Load())
}

// A peer's retry-after is honoured as a floor on the wait before a repeat; a
// very long one (RetryInfo or the detail's retry_after, ≥ ~243 years, or a
// Duration that saturates) overflowed in RetryPolicy.backoff to a negative
// floor, and the client repeated after the ordinary ≤ 20 ms backoff instead
// of concluding (found by review). The suggested wait cannot fit the
// deadline, so there is one try only.
func TestHugeRetryAfterDoesNotOverflow(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.Fields{RetryAfter: time.Duration(1<<63 - 1)})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register) // the peer sends no pushback trailer
	c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAttemptTimeout(5*time.Second))...))
	start := time.Now()
	_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	t.Logf("err=%v runs=%d took=%v", err, runs.Load(), time.Since(start))
	require.Equal(t, int32(1), runs.Load(), "the peer asked for a wait far past the deadline; the client repeated at once")
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A handler's call that cannot fit the time its *try* has left (its context
// ends at the caller's per-try grpc-timeout, well before the attempt's
// deadline) is refused locally DEADLINE_UNREACHABLE marked final. Final
// means no repeat of the attempt can help (DESIGN.md §1), but here the
// caller's next try gets the rest of the attempt and would fit: the server
// itself makes admission's per-try DEADLINE_EXPIRED not final for exactly
// this reason (tryDeadlineOnly). Passed up with status.WithoutEffect, the
// final flag stops the origin from repeating a call that would succeed.
func TestPerTryUnreachableNotFinal(t *testing.T) {
	dep := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	// mid's calls need 6 s of the handler's time (a large hop margin stands
	// for a handler that has to leave that much for its own work).
	toDep := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithHopMargin(6*time.Second))...))

	mid := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		resp, err := toDep.Apply(ctx, r)
		if status.OutcomeOf(err).Kind == status.KindNotAdmitted {
			return nil, status.WithoutEffect(err)
		}
		return resp, err
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	// The origin: 2 tries over a 10 s attempt; by default try 1 waits half
	// of it (5 s, its grpc-timeout), try 2 all that is left (about 10 s).
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(10*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond}))...))

	_, err := origin.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	require.NoError(t, err, "try 2 had the time try 1 lacked, but the origin never sent it (final=%v)", status.IsFinal(err))
	require.Equal(t, int64(2), mid.Calls("Apply"))
	require.Equal(t, int64(1), dep.Calls("Apply"))
}

// A target whose query was answered UNIMPLEMENTED keeps no records, and an
// IDEMPOTENT call in doubt there repeats without the query; but the servers
// behind a target change (a rolling deploy adds a store), so the answer is
// taken for a minute, then the target is asked again.
func TestRecordlessTargetIsAskedAgainAfterAMinute(t *testing.T) {
	var queries atomic.Int64
	var tries atomic.Int64
	svc := &testsvc.Service{PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		if tries.Add(1)%2 == 1 {
			return nil, grpcstatus.Error(codes.Unavailable, "lost on the way back") // in doubt
		}
		return &testingv1.PutResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		queries.Add(1) // no AttemptService here
		return grpcstatus.Error(codes.Unimplemented, "unknown service")
	}))
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithClientClock(now),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))

	put := func() {
		t.Helper()
		_, err := client.Put(t.Context(), &testingv1.PutRequest{Key: "k"})
		require.NoError(t, err)
	}
	put()
	require.Equal(t, int64(1), queries.Load(), "the first doubt is queried")
	put()
	require.Equal(t, int64(1), queries.Load(), "within the minute the target is taken to keep no records")
	offset.Store(int64(recordlessMinute + time.Second))
	put()
	require.Equal(t, int64(2), queries.Load(), "a minute later it is asked again")
	require.Equal(t, int64(6), tries.Load())
}

// recordlessMinute is how long a client takes a target's UNIMPLEMENTED
// query to mean it keeps no records.
const recordlessMinute = time.Minute

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestRetryEventAttributes: DESIGN.md §5 names the attributes of
// each event — tollgate.allowance.spend (units, remaining),
// tollgate.attempt.query (state), tollgate.admission (decision, class,
// queued_ahead) and tollgate.retry (try, reason, delay). The other events
// carry exactly those keys; the retry event carries none of its three.
func TestRetryEventAttributes(t *testing.T) {
	tp, spans := testTracer(t)
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientTracerProvider(tp),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))
	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.Error(t, err)
	require.EqualValues(t, 2, svc.Calls("Get"))

	var retries int
	for _, s := range spans.GetSpans() {
		for _, e := range s.Events {
			if e.Name != "tollgate.retry" {
				continue
			}
			retries++
			for _, key := range []string{"tollgate.try", "reason", "delay"} {
				_, ok := attr(e.Attributes, key)
				require.True(t, ok, "tollgate.retry event lacks %q (has %v)", key, e.Attributes)
			}
		}
	}
	require.Equal(t, 1, retries)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// TestRetryEventForATryNeverSent: origin (allowance 1) → mid →
// dep, dep refuses QUEUE_FULL. mid's call spends its one unit on try 1;
// its ledger is not sealed, so the owner waits a backoff and records
// tollgate.retry for try 2 ("the try about to be sent"), which prepare then
// refuses locally ALLOWANCE_EXHAUSTED: try 2 is never sent. The trace shows a
// retry that did not happen, and the call span reports tollgate.try 2 for a
// call that sent one try.
func TestRetryEventForATryNeverSent(t *testing.T) {
	tp, spans := testTracer(t)
	fast := interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	once := fast
	once.MaxTries = 1
	tr := newTiers(t,
		[]interceptor.ClientOption{interceptor.WithAllowance(1), interceptor.WithRetry(once)},
		[]interceptor.ClientOption{interceptor.WithRetry(fast), interceptor.WithClientTracerProvider(tp)},
		func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
		})
	_, err := tr.origin.Get(t.Context(), &testingv1.GetRequest{})
	require.Error(t, err)
	require.EqualValues(t, 1, tr.dep.Calls("Get"), "mid sent one try: its allowance had one unit")

	var midSpans int
	for _, s := range spans.GetSpans() {
		if s.Name != "tollgate.call" {
			continue
		}
		midSpans++
		retries := 0
		for _, e := range s.Events {
			if e.Name == "tollgate.retry" {
				retries++
			}
		}
		try, _ := attr(s.Attributes, "tollgate.try")
		reason, _ := attr(s.Attributes, "tollgate.reason")
		t.Logf("mid call span: tollgate.try=%d reason=%s retry events=%d", try.AsInt64(), reason.AsString(), retries)
		require.Zero(t, retries, "a tollgate.retry event for a try that was never sent")
		require.EqualValues(t, 1, try.AsInt64(), "the span reports a try that was never sent")
	}
	require.Equal(t, 1, midSpans)
}

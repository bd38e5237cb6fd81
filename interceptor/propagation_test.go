package interceptor_test

import (
	"context"
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// seen records what handlers observed of their attempt.
type seen struct {
	mu        sync.Mutex
	attempts  []interceptor.Attempt
	deadlines []time.Time
}

func (s *seen) note(ctx context.Context) {
	a, _ := interceptor.AttemptFromContext(ctx)
	d, _ := ctx.Deadline()
	s.mu.Lock()
	s.attempts = append(s.attempts, a)
	s.deadlines = append(s.deadlines, d)
	s.mu.Unlock()
}

func (s *seen) all() ([]interceptor.Attempt, []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]interceptor.Attempt(nil), s.attempts...), append([]time.Time(nil), s.deadlines...)
}

// serverOpts are the server options of a trusting tier in tests: every peer
// trusted, no clock skew.
func serverOpts(extra ...interceptor.ServerOption) []grpc.ServerOption {
	return interceptor.ServerOptions(append([]interceptor.ServerOption{
		interceptor.WithTrustedPeer(interceptor.TrustAll),
		interceptor.WithClockSkew(0),
	}, extra...)...)
}

// tiers is a chain origin → mid → dep over bufconn. mid's Get calls dep's Get
// once per call (with mid's client options); dep's behaviour is set by the test.
type tiers struct {
	dep, mid      *testsvc.Service
	depSeen       seen
	midSeen       seen
	origin        testingv1.TestServiceClient
	midClientOpts []interceptor.ClientOption
	midConnToDep  *grpc.ClientConn
}

func newTiers(t *testing.T, originOpts, midOpts []interceptor.ClientOption, depGet func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error)) *tiers {
	t.Helper()
	tr := &tiers{dep: &testsvc.Service{}, mid: &testsvc.Service{}, midClientOpts: midOpts}
	tr.dep.GetFunc = func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		tr.depSeen.note(ctx)
		return depGet(ctx, r)
	}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, tr.dep.Register, serverOpts()...)
	tr.midConnToDep = depEnd.DialT(t, interceptor.DialOptions(midOpts...)...)
	depClient := testingv1.NewTestServiceClient(tr.midConnToDep)
	tr.mid.GetFunc = func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		tr.midSeen.note(ctx)
		return depClient.Get(ctx, r)
	}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, tr.mid.Register, serverOpts()...)
	tr.origin = testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(originOpts...)...))
	return tr
}

func okGet(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
	return &testingv1.GetResponse{Value: "v"}, nil
}

func TestOneAttemptIdentityDeadlineAndKeysAcrossTiers(t *testing.T) {
	tr := newTiers(t, []interceptor.ClientOption{interceptor.WithAttemptTimeout(5 * time.Second), interceptor.WithAllowance(4)}, nil, okGet)
	start := time.Now()
	resp, err := tr.origin.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	require.NoError(t, err)
	require.Equal(t, "v", resp.GetValue())

	mids, midDeadlines := tr.midSeen.all()
	deps, depDeadlines := tr.depSeen.all()
	require.Len(t, mids, 1)
	require.Len(t, deps, 1)
	mid, dep := mids[0], deps[0]
	require.NotEmpty(t, mid.ID)
	require.Equal(t, mid.ID, dep.ID, "one attempt identity on every tier")
	require.Equal(t, mid.Deadline, dep.Deadline, "one deadline on every tier")
	require.False(t, mid.Origin)
	require.False(t, dep.Origin)
	require.Equal(t, "0", mid.Call)
	require.Equal(t, uint32(1), mid.Try)
	require.Equal(t, "0.1.1", dep.Call, "the first call of try 1 of call 0")
	// d was fixed at the origin from the attempt timeout; no hop's deadline passes it.
	require.WithinDuration(t, start.Add(5*time.Second), mid.Deadline, time.Second)
	require.False(t, midDeadlines[0].After(mid.Deadline))
	require.False(t, depDeadlines[0].After(mid.Deadline))
	require.True(t, depDeadlines[0].Before(midDeadlines[0]), "each hop shrinks the deadline by its margin")
}

func TestSeed000SharedAllowanceAddsUpInsteadOfMultiplying(t *testing.T) {
	refuse := func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
	}
	tr := newTiers(t,
		[]interceptor.ClientOption{interceptor.WithAllowance(4), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})},
		[]interceptor.ClientOption{interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})},
		refuse)
	_, err := tr.origin.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	require.Error(t, err)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonAllowanceExhausted, o.Reason)
	require.True(t, o.Final(), "the origin stops on a final ALLOWANCE_EXHAUSTED")
	require.Equal(t, int64(4), tr.dep.Calls("Get"), "the dependency receives the allowance, not 3×2=6")
	require.Equal(t, int64(2), tr.mid.Calls("Get"), "the third origin try is refused locally")
	deps, _ := tr.depSeen.all()
	for _, d := range deps {
		require.Equal(t, deps[0].ID, d.ID)
	}
}

func TestUntrustedHeaderIsIgnoredAndTrustedMalformedIsRefused(t *testing.T) {
	svc := &testsvc.Service{}
	var got seen
	svc.GetFunc = func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		got.note(ctx)
		return &testingv1.GetResponse{}, nil
	}
	untrusted := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(interceptor.WithClockSkew(0))...)
	trusted := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)

	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=attacker;u=1000000;d=99999999999999")
	_, err := testingv1.NewTestServiceClient(untrusted.DialT(t)).Get(ctx, &testingv1.GetRequest{})
	require.NoError(t, err)
	as, _ := got.all()
	require.Len(t, as, 1)
	require.NotEqual(t, "attacker", as[0].ID, "an untrusted peer's attempt is re-minted at the edge")
	require.True(t, as[0].Origin)
	require.WithinDuration(t, time.Now().Add(interceptor.DefaultMaxAttemptTime), as[0].Deadline, 5*time.Second)

	bad := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x;t=0")
	_, err = testingv1.NewTestServiceClient(trusted.DialT(t)).Get(bad, &testingv1.GetRequest{})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err))
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonMalformedHeader, o.Reason)
	require.True(t, o.Final())
	require.Len(t, func() []interceptor.Attempt { a, _ := got.all(); return a }(), 1, "the refused request never reached the handler")
}

func TestClientReplacesAForwardedHeader(t *testing.T) {
	svc := &testsvc.Service{}
	var values []string
	svc.GetFunc = func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		values = md.Get("tollgate")
		return &testingv1.GetResponse{}, nil
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	for name, ctx := range map[string]context.Context{
		"new":    metadata.NewOutgoingContext(t.Context(), metadata.Pairs("tollgate", "a=forwarded", "other", "x")),
		"append": metadata.AppendToOutgoingContext(t.Context(), "Tollgate", "a=forwarded", "other", "x"),
		"both": metadata.AppendToOutgoingContext(metadata.NewOutgoingContext(t.Context(), metadata.Pairs("tollgate", "a=forwarded")),
			"tollgate", "a=forwarded-too"),
	} {
		values = nil
		_, err := client.Get(ctx, &testingv1.GetRequest{})
		require.NoError(t, err, name)
		require.Len(t, values, 1, "%s: exactly one tollgate header", name)
		require.NotContains(t, values[0], "a=forwarded", name)
	}
}

func TestStrictAccountingReportsZeroSpent(t *testing.T) {
	svc := &testsvc.Service{GetFunc: okGet}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	for _, strict := range []bool{false, true} {
		var opts []interceptor.ClientOption
		if strict {
			opts = append(opts, interceptor.WithStrictAccounting())
		}
		client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(opts...)...))
		var trailer metadata.MD
		_, err := client.Get(t.Context(), &testingv1.GetRequest{}, grpc.Trailer(&trailer))
		require.NoError(t, err)
		if strict {
			require.Equal(t, []string{"0"}, trailer.Get("tollgate-spent"))
		} else {
			require.Empty(t, trailer.Get("tollgate-spent"), "a leaf that spent nothing sends no trailer")
		}
	}
}

// DESIGN.md §3.3: ALLOWANCE_EXHAUSTED is final only at the origin, and only
// when spent units reach the allowance. A callee that does not trust its
// caller re-mints the attempt with an allowance of its own; when that
// foreign allowance is spent, its final refusal is passed through a tier
// below the origin (M) and then to the origin (C), whose own allowance is
// untouched. A repeat by C would start a new attempt at B with a fresh
// allowance, so "final" is false there. A review found the final flag
// passed through both tiers.
func TestForeignFinalAllowanceExhaustedIsNotFinalHere(t *testing.T) {
	fast := interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	// E: the leaf.
	eEnd := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{GetFunc: okGet}).Register, serverOpts()...)
	eClient := testingv1.NewTestServiceClient(eEnd.DialT(t, interceptor.DialOptions(interceptor.WithRetry(fast))...))
	// D: spends its one unit on E, then refuses without effect.
	d := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if _, err := eClient.Get(ctx, &testingv1.GetRequest{}); err != nil {
			return nil, err
		}
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
	}}
	dEnd := testsvc.StartT(t, testsvc.Bufconn, d.Register, serverOpts()...)
	dClient := testingv1.NewTestServiceClient(dEnd.DialT(t, interceptor.DialOptions(interceptor.WithRetry(fast))...))
	// B: trusts nobody, so it is the origin of an attempt of its own with
	// one unit.
	b := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		_, err := dClient.Get(ctx, &testingv1.GetRequest{})
		return nil, err
	}}
	bEnd := testsvc.StartT(t, testsvc.Bufconn, b.Register,
		interceptor.ServerOptions(interceptor.WithClockSkew(0), interceptor.WithDefaultAllowance(1))...)
	bClient := testingv1.NewTestServiceClient(bEnd.DialT(t, interceptor.DialOptions(interceptor.WithRetry(fast))...))
	// M: trusted, below the origin.
	var midFinal, midOrigin atomic.Bool
	m := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		_, err := bClient.Get(ctx, &testingv1.GetRequest{})
		a, _ := interceptor.AttemptFromContext(ctx)
		midOrigin.Store(a.Origin)
		o := status.OutcomeOf(err)
		midFinal.Store(o.Reason == status.ReasonAllowanceExhausted && o.Final())
		return nil, err
	}}
	mEnd := testsvc.StartT(t, testsvc.Bufconn, m.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(mEnd.DialT(t, interceptor.DialOptions(interceptor.WithRetry(fast))...))

	ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
	require.NoError(t, err)
	_, err = origin.Get(ctx, &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAllowanceExhausted, o.Reason, "%v", err)

	require.False(t, midOrigin.Load())
	require.False(t, midFinal.Load(),
		"M is below the origin: its call must never end with a final ALLOWANCE_EXHAUSTED (§3.3)")
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	require.False(t, o.Final() && snap.Spent < snap.Total,
		"the origin got a final ALLOWANCE_EXHAUSTED with its allowance not spent: %+v", snap)
}

// DESIGN.md §3.3: the server seals its ledger when it answers; later takes
// are refused, so a goroutine that outlives its handler sends nothing more.
// A server that is its attempt's origin (its caller untrusted, or not
// speaking tollgate) charges its own calls nothing, and prepare never asks
// the sealed ledger for a first try: a review found that the goroutine's
// call went out after the answer.
func TestSealedMintingServerGoroutineSendsNothing(t *testing.T) {
	var arrived atomic.Int64
	leaf := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		arrived.Add(1)
		return &testingv1.GetResponse{}, nil
	}}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	leafClient := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions()...))
	answered := make(chan struct{})
	late := make(chan error, 1)
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		go func() {
			<-answered
			_, err := leafClient.Get(context.WithoutCancel(ctx), &testingv1.GetRequest{})
			late <- err
		}()
		return &testingv1.GetResponse{}, nil
	}}
	// No WithTrustedPeer: the mid server mints the attempt (its origin).
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register,
		interceptor.ServerOptions(interceptor.WithClockSkew(0), interceptor.WithDefaultAllowance(4))...)
	_, err := testingv1.NewTestServiceClient(midEnd.DialT(t)).Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	close(answered)
	lateErr := <-late
	require.Zero(t, arrived.Load(), "a call sent after the handler answered reached a server (late call: %v)", lateErr)
	o := status.OutcomeOf(lateErr)
	require.Equal(t, status.ReasonAllowanceExhausted, o.Reason, "%v", lateErr)
	require.True(t, o.Final(), "no call under a sealed minting ledger can ever be sent: final")
}

// DESIGN.md §3.3, §3.6: at the origin, once its allowance is spent (an
// allowance of 0 is spent from the start), the callee's non-final
// ALLOWANCE_EXHAUSTED becomes final (client.result). Only the flag should
// change: the callee's retry-after (a new attempt's wait) and message are
// what the caller decides anew with. A review found that result rebuilt
// the error from scratch and dropped both.
func TestOriginFinalAllowanceExhaustedKeepsCalleesRetryAfterAndMessage(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonAllowanceExhausted,
			status.WithRetryAfter(2*time.Second), status.WithMessage("dependency quota for tenant x")))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAllowance(0),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}),
	)...))
	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonAllowanceExhausted, o.Reason, "%v", err)
	require.True(t, o.Final(), "the origin's allowance (0) is spent: final (§3.3)")
	ra, ok := status.RetryAfter(err)
	require.True(t, ok && ra > 0, "the callee's retry-after was dropped when the final flag was set: %v", err)
	require.Contains(t, grpcstatus.Convert(err).Message(), "dependency quota",
		"the callee's message was replaced")
}

// client.result rebuilds a refusal whose final flag it changes; a review
// found that it took the old status message as the new one's Message, so
// the reason's own prefix was said twice, and dropped the retry-after.
func TestNonFinalRebuildDoesNotRepeatPrefix(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		// A callee of another make (or an older build) that sends a final
		// ALLOWANCE_EXHAUSTED: answered here without tollgate's server.
		return nil, status.NotAdmitted(status.ReasonAllowanceExhausted, status.Final(),
			status.WithRetryAfter(2*time.Second), status.WithMessage("quota"))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAllowance(4),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}),
	)...))
	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonAllowanceExhausted, o.Reason, "%v", err)
	require.False(t, o.Final(), "%v", err)
	msg := grpcstatus.Convert(err).Message()
	prefix := strings.SplitN(msg, ":", 2)[0]
	require.Equal(t, 1, strings.Count(msg, prefix+":"), "message %q", msg)
	ra, ok := status.RetryAfter(err)
	require.True(t, ok && ra > 0, "retry-after dropped: %v", err)
}

// TestNoAllowanceStopsAtTheCalleesExhaustion: an origin with an allowance
// of 0 repeats under its policy a call whose callee needs no unit; but a
// callee that answers ALLOWANCE_EXHAUSTED needed units the origin can never
// lend it, and a review found that every repeat was sent, to be refused the
// same way. The origin now ends the call at once, final.
func TestNoAllowanceStopsAtTheCalleesExhaustion(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonAllowanceExhausted))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAllowance(0),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))
	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonAllowanceExhausted, o.Reason, "%v", err)
	require.True(t, o.Final())
	require.Equal(t, int64(1), svc.Calls("Get"), "no repeat can be lent a unit")
}

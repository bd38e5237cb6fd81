package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"sync"
	"sync/atomic"
)

// R1: a server with a store and the default trust function (untrusted peers)
// re-mints every try's attempt; the owner's FenceAttempt fences the client's
// (absent) attempt ID, gets FENCED, and repeats: the handler runs twice.
func TestRegressionUntrustedPeerFenceLiesHandlerRunsTwice(t *testing.T) {
	release := make(chan struct{})
	ledger := newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithClockSkew(0), interceptor.WithAttemptStore(store))...) // default: no peer trusted
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(5*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 500 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}),
	)...))
	go func() {
		for ledger.effects.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(1200 * time.Millisecond) // past try 1's per-try timeout: the owner fences and may repeat
		close(release)
	}()
	_, _ = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 3})
	time.Sleep(400 * time.Millisecond)
	require.GreaterOrEqual(t, ledger.effects.Load(), int64(1), "try 1 never reached the handler: the scenario did not happen")
	require.Equal(t, int64(1), ledger.effects.Load(), "handler of a state-changing method ran more than once for one call")
}

// R2: the resolution query replaces the call's outgoing metadata (and drops
// its CallOptions). A server whose tenant function reads request metadata
// resolves the query under another tenant: the fence lands on an absent
// record and answers FENCED; the call ends NOT_ADMITTED although the handler
// ran (its effect happened) under the right tenant.
func TestRegressionQueryLosesTenantMetadataNotAdmittedAfterEffect(t *testing.T) {
	release := make(chan struct{})
	ledger := newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	tenantOf := func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-tenant"); len(v) == 1 {
			return v[0]
		}
		return ""
	}
	store := memoryStore(t)
	end2 := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithTenant(tenantOf))...)
	client := testingv1.NewTestServiceClient(end2.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(3*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 50 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}),
	)...))
	defer close(release)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "acme")
	_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 3})
	require.Equal(t, int64(1), ledger.effects.Load(), "the effect happened")
	o := status.OutcomeOf(err)
	require.NotEqual(t, status.KindNotAdmitted, o.Kind, "NOT_ADMITTED claims no effect, but the handler ran: %v", err)
}

// R3: an IDEMPOTENT call whose every try ended without a peer status (or with
// a raw UNAVAILABLE) at a callee without records ends with the raw status:
// no tollgate detail, no attempt ID, code UNAVAILABLE, although its outcome is
// UNKNOWN (DESIGN §2.5, §3.5).
func TestRegressionIdempotentUnknownReturnedAsRawUnavailable(t *testing.T) {
	plain := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{
		PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			return nil, grpcstatus.Error(codes.Unavailable, "upstream reset")
		},
	}).Register) // a callee that does not speak tollgate
	client := testingv1.NewTestServiceClient(plain.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...))
	_, err := client.Put(t.Context(), &testingv1.PutRequest{Key: "k", Value: "v"})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind)
	require.NotEqual(t, codes.Unavailable, grpcstatus.Code(err), "UNKNOWN must never be sent as UNAVAILABLE: %v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "UNKNOWN names its attempt")
}

// R4: a held grant is not reconciled when the record finished UNKNOWN
// (DESIGN §3.3 lists UNKNOWN among the finished states that settle it): the
// units stay held for the rest of the attempt.
func TestRegressionFinishedUnknownRecordDoesNotReconcileHeldGrant(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		time.Sleep(150 * time.Millisecond)
		return nil, grpcstatus.Error(codes.Internal, "boom after effect")
	}}
	end := recordedServer(t, svc, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 50 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}),
	)...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	l, _ := budget.FromContext(ctx)
	snap := l.Snapshot()
	require.Zero(t, snap.Held, "finished UNKNOWN record (units_spent=0) must settle the held grant: %+v", snap)
}

// R5: FenceAttempt carries no request fingerprint; an owner that resolves an
// unknown try of an explicit key whose record holds ANOTHER request's
// SUCCEEDED result returns that other request's response as its own (§2.2:
// "refused, never replayed wrongly").
func TestRegressionResolveReplaysAnotherRequestsResponse(t *testing.T) {
	ledger := newLedger(nil)
	var drop atomic.Bool
	dropper := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == testingv1.TestService_Apply_FullMethodName && drop.CompareAndSwap(true, false) {
			return nil, grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
		}
		return h(ctx, req)
	})
	end := recordedServer(t, &ledger.Service, memoryStore(t), dropper)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	ctx = interceptor.WithCallKey(ctx, "reserve")
	a, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7}) // run 1
	require.NoError(t, err)
	require.Equal(t, int64(7), a.GetTotal())
	drop.Store(true) // run 2's first try is lost before reaching the handler
	b, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "other", Amount: 100})
	require.Error(t, err, "request B with A's key must be refused (mismatch), got A's response %v", b)
}

// R7: §2.3: tollgate-spent is sent "when > 0, or when the request carried
// r=1". A try refused in begin (DEADLINE_EXPIRED) from a trusted strict
// caller gets no trailer, so the strict caller holds its grant forever.
func TestRegressionStrictRefusalInBeginHasNoSpentTrailer(t *testing.T) {
	svc := &testsvc.Service{}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	id, _ := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	a, _ := interceptor.AttemptFromContext(id)
	past := time.Now().Add(-time.Second).UnixMilli()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID+";u=3;r=1;d="+itoa(past))
	var tr metadata.MD
	_, err := client.Get(ctx, &testingv1.GetRequest{Key: "k"}, grpc.Trailer(&tr))
	require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason, "%v", err)
	require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"), "r=1 requires tollgate-spent on every answer")
}

// R9: the server's own tenant function returning a value outside the token
// charset (a SPIFFE ID, an e-mail) makes every recorded call fail
// INVALID_ARGUMENT MALFORMED_HEADER, final — blaming a caller that sent a
// well-formed header (or none at all).
func TestRegressionServerTenantBlamedOnCallerHeader(t *testing.T) {
	ledger := newLedger(nil)
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAttemptStore(store),
		interceptor.WithTenant(func(context.Context) string { return "spiffe://acme/ns/web" }))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	require.NotEqual(t, status.ReasonMalformedHeader, o.Reason, "the caller's header was well-formed: %v", err)
}

// R10: a stream's resolution polls with the stream's mutex held; Context()
// must not wait for it. The handler is held until Context() has returned, so
// a Context() that waited for the resolution would never return (the test
// would time out in Eventually), whatever the machine's speed.
func TestRegressionStreamContextDoesNotBlockDuringResolution(t *testing.T) {
	var first atomic.Bool
	var inner sync.WaitGroup
	drained, release := make(chan struct{}), make(chan struct{})
	var queries atomic.Int64
	outerStream := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod == testingv1.TestService_Upload_FullMethodName && first.CompareAndSwap(false, true) {
			inner.Add(1)
			go func() { defer inner.Done(); _ = h(srv, ss) }() // tollgate + handler go on
			<-drained
			return grpcstatus.Error(codes.Internal, "proxy: upstream reset") // the caller loses the answer
		}
		return h(srv, ss)
	})
	outerUnary := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == tollgatev1.AttemptService_FenceAttempt_FullMethodName {
			queries.Add(1)
		}
		return h(ctx, req)
	})
	svc := &testsvc.Service{UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		n, _ := testsvc.DrainUpload(st)
		close(drained)
		<-release // the effect is slow to finish: the owner polls IN_PROGRESS
		return st.SendAndClose(&testingv1.UploadResponse{Count: n})
	}}
	end := recordedServer(t, svc, memoryStore(t), outerStream, outerUnary)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}),
	)...))
	st, err := client.Upload(t.Context())
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.UploadRequest{}))
	done := make(chan struct{})
	go func() { defer close(done); _, _ = st.CloseAndRecv() }()
	require.Eventually(t, func() bool { return queries.Load() > 0 }, 10*time.Second, time.Millisecond, "the owner queries the record")
	var returned atomic.Bool
	go func() { _ = st.Context(); returned.Store(true) }()
	require.Eventually(t, returned.Load, 10*time.Second, time.Millisecond, "Context() waited for the resolution")
	close(release)
	<-done
	inner.Wait()
}

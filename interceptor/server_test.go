package interceptor_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// R1: a server with a store and the default trust function (untrusted peers)
// re-mints every try's attempt; the owner's FenceAttempt fences the client's
// (absent) attempt ID, gets FENCED, and repeats: the handler runs twice.
func TestUntrustedPeerFenceLiesHandlerRunsTwice(t *testing.T) {
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
func TestQueryLosesTenantMetadataNotAdmittedAfterEffect(t *testing.T) {
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
func TestIdempotentUnknownReturnedAsRawUnavailable(t *testing.T) {
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
func TestFinishedUnknownRecordDoesNotReconcileHeldGrant(t *testing.T) {
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
func TestResolveReplaysAnotherRequestsResponse(t *testing.T) {
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
func TestStrictRefusalInBeginHasNoSpentTrailer(t *testing.T) {
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
func TestServerTenantBlamedOnCallerHeader(t *testing.T) {
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
func TestStreamContextDoesNotBlockDuringResolution(t *testing.T) {
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

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// f78bea8 wraps the handler's ServerTransportStream (handlerTransport) so
// that a handler's grpc.SetTrailer loses tollgate-spent. But grpc-go's
// grpc.SetSendCompressor and grpc.ClientSupportedCompressors type-assert
// ServerTransportStreamFromContext(ctx) to *transport.ServerStream
// (server.go of grpc-go v1.85) and fail on any wrapper: every handler
// behind tollgate's interceptor, with or without a store, lost them, unary
// and stream alike. grpc-go documents both for "the context passed to the
// server's handler".
func TestServerCompressor(t *testing.T) {
	type got struct {
		names    []string
		namesErr error
		setErr   error
	}
	unary := make(chan got, 1)
	stream := make(chan got, 1)
	svc := &testsvc.Service{
		GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			var g got
			g.names, g.namesErr = grpc.ClientSupportedCompressors(ctx)
			g.setErr = grpc.SetSendCompressor(ctx, gzip.Name)
			unary <- g
			return &testingv1.GetResponse{}, nil
		},
		WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			var g got
			g.names, g.namesErr = grpc.ClientSupportedCompressors(st.Context())
			g.setErr = grpc.SetSendCompressor(st.Context(), gzip.Name)
			stream <- g
			return nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	c := testingv1.NewTestServiceClient(end.DialT(t))

	_, err := c.Get(t.Context(), &testingv1.GetRequest{Key: "k"}, grpc.UseCompressor(gzip.Name))
	require.NoError(t, err)
	g := <-unary
	assert.NoError(t, g.namesErr, "unary handler: grpc.ClientSupportedCompressors")
	assert.Contains(t, g.names, gzip.Name)
	assert.NoError(t, g.setErr, "unary handler: grpc.SetSendCompressor")

	ws, err := c.Watch(t.Context(), &testingv1.WatchRequest{}, grpc.UseCompressor(gzip.Name))
	require.NoError(t, err)
	for {
		if _, err := ws.Recv(); err != nil {
			break
		}
	}
	g = <-stream
	assert.NoError(t, g.namesErr, "stream handler: grpc.ClientSupportedCompressors")
	assert.NoError(t, g.setErr, "stream handler: grpc.SetSendCompressor")
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §2.1: a malformed tollgate header, from a trusted peer or not,
// "is counted in a metric" (tollgate.metadata.malformed). The control path
// counts an untrusted peer's malformed header on GetAttempt, but a
// FenceAttempt from an untrusted peer is answered UNKNOWN before its header
// is looked at, so the same malformed header goes uncounted there.
func TestServerFenceMalformed(t *testing.T) {
	mp, reader := testMeter(t)
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0),
		interceptor.WithServerMeterProvider(mp))...) // no peer trusted
	client := tollgatev1.NewAttemptServiceClient(end.DialT(t))
	bad := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x y") // bad charset
	id := "01a22bcd-4490-7a20-a651-a5fcfed10e60"

	_, err := client.GetAttempt(bad, &tollgatev1.GetAttemptRequest{AttemptId: id, Call: "0", Method: "/x.Y/Z"})
	require.NoError(t, err)
	collect := func() int64 {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(t.Context(), &rm))
		return counter(rm, "tollgate.metadata.malformed")
	}
	require.Equal(t, int64(1), collect(), "GetAttempt counts the untrusted peer's malformed header")

	_, err = client.FenceAttempt(bad, &tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: "/x.Y/Z", FenceThroughTry: 1})
	require.NoError(t, err)
	require.Equal(t, int64(2), collect(), "FenceAttempt from an untrusted peer with a malformed header is not counted")
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §2.3: the callee reports what it and everything below it spent
// in one tollgate-spent trailer; the client reads exactly one value
// (parseSpent), and anything else holds the grant. A handler that relays
// its upstream's trailer metadata to its own caller — the usual transparent
// gateway, grpc.Trailer(&md) on its call then grpc.SetTrailer(ctx, md) —
// forwards the upstream's tollgate-spent, and the server interceptor then
// appends its own (grpc-go's SetTrailer merges): the caller sees two values,
// cannot read either, and holds the whole grant although the call ended
// and said what it spent. The server owns this key on its answers, as the
// client owns the tollgate header it replaces (§2.1: "a gateway that
// forwards incoming metadata must not produce two"); it should drop or
// replace a tollgate-spent the handler set.
func TestServerForwardedTrailer(t *testing.T) {
	dep := &testsvc.Service{GetFunc: okGet}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	// The gateway asks its upstream for strict reports, so the upstream's
	// trailer always carries tollgate-spent (here 0).
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions(interceptor.WithStrictAccounting())...))
	mid := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		var tr metadata.MD
		resp, err := depClient.Get(ctx, r, grpc.Trailer(&tr))
		_ = grpc.SetTrailer(ctx, tr) // relay the upstream's trailer
		return resp, err
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions()...))

	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	var tr metadata.MD
	_, err = origin.Get(ctx, &testingv1.GetRequest{Key: "k"}, grpc.Trailer(&tr))
	require.NoError(t, err)
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	require.Equal(t, int64(0), snap.Held,
		"the gateway answered OK and spent 1 unit, but its trailer tollgate-spent=%q cannot be read: the whole grant is held (%+v)",
		tr.Get("tollgate-spent"), snap)
	require.Equal(t, int64(1), snap.Spent, "%+v", snap)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §3.7: records live "TTL counted from the last write, ≥ the
// server's maximum attempt deadline + skew + grace". ServerOptions checks
// that the store's policy has the server's clock skew (a store that tells
// its Policy), but not that its TTL (or MaxAttemptDeadline, "the longest
// attempt deadline the server accepts") covers WithMaxAttemptTime: a server
// accepting 10-minute attempts in front of a store that keeps records 5
// minutes is built without a word, and its calls made after the first 5
// minutes of an attempt are refused ATTEMPT_UNVERIFIABLE (see
// TestServerOldAttempt).
func TestServerMaxAttempt(t *testing.T) {
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica) // DefaultPolicy: MaxAttemptDeadline 2 min, TTL 5 min
	require.NoError(t, err)
	p := store.Policy()
	_, err = interceptor.NewServerOptions(interceptor.WithAttemptStore(store),
		interceptor.WithMaxAttemptTime(10*time.Minute))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption,
		"a 10 min maximum attempt time with a store whose TTL is %v (MaxAttemptDeadline %v) was accepted", p.TTL, p.MaxAttemptDeadline)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// grpc-go serves any method name a grpc.ServiceDesc declares (hand-written
// descriptors, generated code of other IDLs, proxies): "/pkg.Svc/get-item"
// is a valid gRPC path. With an attempt store, tollgate keys the record by
// the method and the key validator (idempotency.ValidateKey) accepts only
// protobuf identifiers, so every call of such a method is refused
// NOT_ADMITTED STORE_UNAVAILABLE, final ("the server cannot key this call's
// record") and the method cannot be served at all, by any caller, trusted or
// not — although nothing in the record key needs the method to be a
// protobuf name (it is an opaque string ≤ 512 bytes to both stores).
func TestServerMethodName(t *testing.T) {
	var runs atomic.Int64
	desc := grpc.ServiceDesc{
		ServiceName: "tollgate.testing.v1.Hyphen",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "apply-v2",
			Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := new(testingv1.ApplyRequest)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, req any) (any, error) {
					runs.Add(1)
					return &testingv1.ApplyResponse{Total: 1}, nil
				}
				if icpt == nil {
					return h(ctx, in)
				}
				return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/tollgate.testing.v1.Hyphen/apply-v2"}, h)
			},
		}},
	}
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { s.RegisterService(&desc, struct{}{}) },
		interceptor.ServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0))...)
	conn := end.DialT(t)
	out := new(testingv1.ApplyResponse)
	err := conn.Invoke(t.Context(), "/tollgate.testing.v1.Hyphen/apply-v2", &testingv1.ApplyRequest{Key: "k"}, out)
	o := status.OutcomeOf(err)
	require.NoError(t, err, "refused %v %v final=%v: %v", o.Kind, status.ReasonName(o.Reason), o.Final(), err)
	require.Equal(t, int64(1), runs.Load())
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §3.1: every hop's context deadline is ≤ d + skew, and "a request
// with no deadline gets the server's maximum"; no layer extends the deadline.
// A trusted peer whose tollgate header carries no "d" (the field is optional
// on the wire) but whose request has a grpc-timeout of 1 s has a deadline:
// the server must not make the attempt's deadline its 30 s maximum. Without a
// store the handler's context still ends at the grpc-timeout, but the
// attempt's deadline (which the handler's outbound calls carry as "d") is
// 30 s; with a store the handler runs detached until that 30 s, far past
// the only deadline the caller ever gave. A caller without a header (or an
// untrusted one) gets its grpc-timeout as the attempt's deadline.
func TestServerNoDeadlineField(t *testing.T) {
	for _, withStore := range []bool{false, true} {
		name := "no-store"
		if withStore {
			name = "store"
		}
		t.Run(name, func(t *testing.T) {
			type seenT struct {
				attempt time.Time
				ctx     time.Time
			}
			seen := make(chan seenT, 1)
			svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				a, _ := interceptor.AttemptFromContext(ctx)
				d, _ := ctx.Deadline()
				seen <- seenT{a.Deadline, d}
				return &testingv1.ApplyResponse{}, nil
			}}
			opts := []interceptor.ServerOption{interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0)}
			var store idempotency.Store
			if withStore {
				store = memoryStore(t)
				opts = append(opts, interceptor.WithAttemptStore(store))
			}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(opts...)...)
			client := testingv1.NewTestServiceClient(end.DialT(t))

			id, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
			require.NoError(t, err)
			a, _ := interceptor.AttemptFromContext(id)
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			reqDeadline, _ := ctx.Deadline()
			ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", "a="+a.ID+";c=0;t=1")
			_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
			require.NoError(t, err)
			s := <-seen
			slack := 100 * time.Millisecond
			require.False(t, s.ctx.After(reqDeadline.Add(slack)),
				"the handler's context runs until %v, past the request's deadline %v", s.ctx, reqDeadline)
			require.False(t, s.attempt.After(reqDeadline.Add(slack)),
				"the attempt's deadline became %v (the server's maximum), past the request's deadline %v", s.attempt, reqDeadline)
		})
	}
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// The README's quick start registers idempotency.NewAttemptService(store)
// beside ServerOptions(..., WithAttemptStore(store) /* optional */). A server
// built without the (optional) WithAttemptStore but with the AttemptService
// registered keeps no record of any call, yet answers every owner's
// FenceAttempt on such a call FENCED — "no try ≤ n ran, or ever will" —
// which is false: try n ran, or is running. The owner then repeats the call
// as try n+1 and the handler runs twice (DESIGN.md §3.7: at most once per
// record; §3.5: FENCED → repeat). tollgate's interceptor sees the ballot on
// the control path and knows it keeps no records: it must not let a fence
// be cast for calls it never records (answer UNKNOWN, or UNIMPLEMENTED so
// the owner treats the callee as recordless).
func TestServerNoStoreFence(t *testing.T) {
	store := memoryStore(t)
	var first atomic.Bool
	first.Store(true)
	ledger := newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
		if first.Swap(false) {
			time.Sleep(900 * time.Millisecond) // past the per-try timeout: the answer is late
		}
	})
	end := storelessServer(t, store, ledger.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(5*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 300 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))

	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	time.Sleep(1200 * time.Millisecond) // let the first run finish
	require.Equal(t, int64(1), ledger.effects.Load(),
		"the handler ran %d times: the fence answered FENCED for a call the server never records (call ended %v %v: %v)",
		ledger.effects.Load(), o.Kind, status.ReasonName(o.Reason), err)
}

// storelessServer starts a server whose interceptor has no
// WithAttemptStore but which registers an AttemptService over store beside
// register's services.
func storelessServer(t *testing.T, store idempotency.Store, register func(*grpc.Server)) *testsvc.Endpoint {
	t.Helper()
	return testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0))...)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// f78bea8 makes a server whose interceptor has no WithAttemptStore answer
// FenceAttempt UNIMPLEMENTED "whatever service is registered: its data path
// keeps no records, so a fence would tell the owner a try never ran when it
// may have" (README). GetAttempt on the same server still reaches the
// registered service and answers UNSEEN for a call whose handler ran and
// committed: tollgate.proto defines UNSEEN as "the store holds no record and
// can vouch that it would", which this server cannot (DESIGN.md §3.8:
// absence is evidence only where records are kept). An operator or tool
// reading it (GetAttempt is "for operators and tools") concludes the try
// never ran and runs it again — the very false answer the fence change
// removed. GetAttempt should be answered as FenceAttempt is (UNIMPLEMENTED),
// or UNKNOWN.
func TestServerNoStoreGet(t *testing.T) {
	store := memoryStore(t)
	var runs atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return &testingv1.ApplyResponse{Total: 1}, nil
	}}
	conn := storelessServer(t, store, svc.Register).DialT(t)

	time.Sleep(2 * time.Millisecond) // the attempt is created after the store's horizon
	id, err := interceptor.StartAttempt(t.Context(), 0, 30*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(id)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID+";c=0;t=1;d="+itoa(a.Deadline.UnixMilli()))
	_, err = testingv1.NewTestServiceClient(conn).Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
	require.NoError(t, err)
	require.Equal(t, int64(1), runs.Load())

	rec, err := tollgatev1.NewAttemptServiceClient(conn).GetAttempt(metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID),
		&tollgatev1.GetAttemptRequest{AttemptId: a.ID, Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	if err == nil {
		require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN.String(), rec.GetState().String(),
			"the call ran and committed, but this server (no WithAttemptStore) vouches that no try of it started")
	}
}

// A review found that an attempt older than the store's TTL (5 min by
// default) can make no recorded call, even the first try of a fresh call
// whose deadline lies well ahead, and that the refusal did not say why.
// The limit itself stands: a record lives TTL after its last write, and a
// fence's tombstone knows no deadline, so after ts − skew + TTL the absence
// of a record no longer proves that no earlier try ran (DESIGN.md §3.8).
// The refusal now says so, the call ends NOT_ADMITTED (nobody else can have
// sent the first try of a numbered key) and the handler never runs; the
// README states the limit.
//
// Scaled down: TTL 200 ms, MaxAttemptDeadline and the server's
// WithMaxAttemptTime 100 ms (a consistent configuration), an attempt of 5 s
// whose first call comes 300 ms after it was created.
func TestServerOldAttempt(t *testing.T) {
	p := idempotency.Policy{Skew: 0, Grace: 10 * time.Millisecond, MaxAttemptDeadline: 100 * time.Millisecond,
		TTL: 200 * time.Millisecond, MaxResponseBytes: 1 << 10}
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	var runs atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return &testingv1.ApplyResponse{Total: 1}, nil
	}}
	end := mintedServer(t, svc, store, interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0),
		interceptor.WithMaxAttemptTime(p.MaxAttemptDeadline))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	time.Sleep(5 * time.Millisecond) // the attempt is created after the store's horizon
	ctx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	time.Sleep(p.TTL + 100*time.Millisecond) // local work before the attempt's first call

	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason, "%v", err)
	require.True(t, o.Final(), "%v", err)
	require.Contains(t, err.Error(), "longer ago than the store keeps records", "the refusal says why")
	require.Equal(t, int64(0), runs.Load(), "the handler never ran")
}

// transparentProxy is a grpc.UnknownServiceHandler that forwards every call,
// with its incoming metadata, to upstream and relays the answer, header and
// trailer included: the "forwards each request to exactly one upstream
// without retrying it" hop of DESIGN.md §2.3.
func transparentProxy(upstream *grpc.ClientConn) grpc.StreamHandler {
	return func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		md, _ := metadata.FromIncomingContext(ss.Context())
		ctx := metadata.NewOutgoingContext(ss.Context(), md.Copy())
		cs, err := upstream.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method,
			grpc.ForceCodec(rawCodec{}))
		if err != nil {
			return err
		}
		go func() {
			for {
				f := &rawFrame{}
				if err := ss.RecvMsg(f); err != nil {
					_ = cs.CloseSend()
					return
				}
				if err := cs.SendMsg(f); err != nil {
					return
				}
			}
		}()
		first := true
		for {
			f := &rawFrame{}
			err := cs.RecvMsg(f)
			if first {
				if h, herr := cs.Header(); herr == nil {
					_ = ss.SendHeader(h)
				}
				first = false
			}
			if errors.Is(err, io.EOF) {
				ss.SetTrailer(cs.Trailer())
				return nil
			}
			if err != nil {
				ss.SetTrailer(cs.Trailer())
				return err
			}
			if err := ss.SendMsg(f); err != nil {
				return err
			}
		}
	}
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §2.3/§3.3 allow a hop that forwards each request to exactly one
// upstream (the README: "every hop between two tollgate peers either speaks
// tollgate or forwards each request to exactly one upstream"), and such a
// proxy may run tollgate's server interceptor for admission
// (regression15_serverrawrelay_test.go). A transparent proxy forwards every
// method, AttemptService's included, through grpc.UnknownServiceHandler: the
// owner's FenceAttempt reaches the upstream, whose store recorded the try.
//
// 48aa2a2 moved the "no WithAttemptStore → UNIMPLEMENTED" answer from
// fenceShortcut (unary FenceAttemptRequest only) into control(), where it
// also catches control *streams* (req == nil). A generated AttemptService is
// unary, so an AttemptService method reaching the stream interceptor is an
// unknown-service handler — a proxy — whose answer is its upstream's. The
// proxy's interceptor now answers UNIMPLEMENTED itself: the owner cannot
// resolve a lost try, and a call whose handler committed upstream ends
// UNKNOWN (§3.5) instead of returning the upstream's stored response.
func TestServerProxyFence(t *testing.T) {
	store := memoryStore(t)
	var runs atomic.Int64
	backend := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if runs.Add(1) == 1 {
			time.Sleep(300 * time.Millisecond) // outlives the owner's first try; detached, it commits
		}
		return &testingv1.ApplyResponse{Total: 7}, nil
	}}
	backEnd := recordedServer(t, backend, store)
	upstream := backEnd.DialT(t) // the proxy's own client: no tollgate options

	// The proxy runs tollgate's interceptor (it trusts the origin, keeps no
	// records) and forwards everything.
	proxyEnd := testsvc.StartT(t, testsvc.Bufconn, func(*grpc.Server) {},
		append(serverOpts(), grpc.UnknownServiceHandler(transparentProxy(upstream)), grpc.ForceServerCodec(rawCodec{}))...)

	time.Sleep(2 * time.Millisecond) // the attempt is created after the store's horizon
	origin := testingv1.NewTestServiceClient(proxyEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 100 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	resp, err := origin.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	require.NoError(t, err, "the upstream committed the call and keeps its record, but its owner could not resolve it through the proxy")
	require.Equal(t, int64(7), resp.GetTotal())
	require.Equal(t, int64(1), runs.Load())
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §2.3/§3.3 let a hop between two tollgate peers forward each
// request to exactly one upstream without speaking tollgate's client: a
// transparent proxy passes the incoming metadata (the tollgate header, so
// the upstream is granted the caller's units) and relays the upstream's
// trailer, tollgate-spent included. Such a proxy may still run tollgate's
// server interceptor (for admission). Before f78bea8 the caller read the
// upstream's tollgate-spent through it. f78bea8 drops tollgate-spent from
// every trailer a handler sets (handlerTransport, serverStream.SetTrailer),
// and the proxy's interceptor reports its own ledger, which lent nothing
// (spent 0: lenient, no trailer): the caller refunds the whole grant
// although its upstream spent a unit of it, and can lend it again — more
// RPCs below the origin than the allowance (§3.3).
func TestServerRawRelay(t *testing.T) {
	leaf := &testsvc.Service{GetFunc: okGet}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	leafClient := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions()...))
	// dep spends one unit: it calls leaf once through tollgate's client.
	dep := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return leafClient.Get(ctx, r)
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(depEnd.DialT(t)) // the proxy's own client: no tollgate options
	// The proxy forwards the request with its incoming metadata and relays
	// the upstream's trailer.
	proxy := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		out := metadata.MD{"tollgate": md.Get("tollgate")}
		var tr metadata.MD
		resp, err := plain.Get(metadata.NewOutgoingContext(ctx, out), r, grpc.Trailer(&tr))
		_ = grpc.SetTrailer(ctx, tr)
		return resp, err
	}}
	proxyEnd := testsvc.StartT(t, testsvc.Bufconn, proxy.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(proxyEnd.DialT(t, interceptor.DialOptions()...))

	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	var tr metadata.MD
	_, err = origin.Get(ctx, &testingv1.GetRequest{Key: "k"}, grpc.Trailer(&tr))
	require.NoError(t, err)
	require.Equal(t, int64(1), leaf.Calls("Get"))
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	require.Equal(t, int64(1), snap.Spent+snap.Held,
		"one unit was spent below the proxy (dep called leaf), but the caller's ledger says %+v (trailer %v)", snap, tr)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// 48aa2a2 removed f78bea8's handlerTransport/serverStream.SetTrailer wrapper,
// which kept both keys the interceptor owns — tollgate-spent and
// grpc-retry-pushback-ms — out of a handler's trailer ("or an upstream's
// pushback as this server's"). It made the client read several
// tollgate-spent values as their largest, but left grpc-retry-pushback-ms
// alone: parsePushback still reads anything but exactly one value as "do
// not retry" (stopPushback), as grpc-go does.
//
// A hop that relays its upstream's trailer (the raw relay 48aa2a2 is written
// for) now sends two pushback values whenever its own answer is a
// NOT_ADMITTED with a delay — here the upstream's QUEUE_FULL refusal of a
// NO_SIDE_EFFECTS method, which stays NOT_ADMITTED (DESIGN.md §3.6) and
// gets the interceptor's own pushback (§2.3). The owner reads "do not
// retry" and gives up after one try on a refusal that asks to be repeated
// in 5 ms. (So does a handler that calls status.SetPushbackTrailer, the
// helper status documents for handlers, and returns the same refusal.)
func TestServerRelayPushback(t *testing.T) {
	leaf := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(5*time.Millisecond))
	}}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(leafEnd.DialT(t)) // the proxy's own client: no tollgate options
	var relayed atomic.Pointer[metadata.MD]
	proxy := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		var tr metadata.MD
		resp, err := plain.Get(metadata.NewOutgoingContext(ctx, metadata.MD{"tollgate": md.Get("tollgate")}), r, grpc.Trailer(&tr))
		relayed.Store(&tr)
		_ = grpc.SetTrailer(ctx, tr)
		return resp, err
	}}
	proxyEnd := testsvc.StartT(t, testsvc.Bufconn, proxy.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(proxyEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))

	ctx, err := interceptor.StartAttempt(t.Context(), 6, 5*time.Second)
	require.NoError(t, err)
	var tr metadata.MD
	_, err = origin.Get(ctx, &testingv1.GetRequest{Key: "k"}, grpc.Trailer(&tr))
	require.Error(t, err)
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "%v", err)
	require.Equal(t, int64(3), leaf.Calls("Get"),
		"a QUEUE_FULL refusal asking for a repeat in 5 ms was tried %d time(s) of 3: the relay's trailer carries grpc-retry-pushback-ms %q (upstream's %q)",
		leaf.Calls("Get"), tr.Get(status.PushbackKey), relayed.Load().Get(status.PushbackKey))
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// README (AttemptService): "Malformed IDs, call keys, methods and
// fence_through_try 0 are INVALID_ARGUMENT with a message saying which."
// The interceptor answers an untrusted peer's FenceAttempt with an UNKNOWN
// record before the service sees it, whatever the request holds: an empty
// attempt ID, a bad method and fence_through_try 0 all read as a valid
// question answered UNKNOWN.
func TestServerUntrustedFenceValidate(t *testing.T) {
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0))...) // no peer trusted
	client := tollgatev1.NewAttemptServiceClient(end.DialT(t))
	rec, err := client.FenceAttempt(t.Context(), &tollgatev1.FenceAttemptRequest{AttemptId: "", Call: "", Method: "not a method", FenceThroughTry: 0})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "a malformed FenceAttempt was answered %v (record %v)", err, rec)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// f78bea8 gave every RefusedUnverifiable without VerifiableFrom one
// message (msgUnverifiable, records.go): "the attempt was created longer
// ago than the store keeps records (its TTL, less the clock skew) ... or
// its ID's time lies ahead of this server's clock". Both stores also refuse
// that way an attempt ID that is not a UUIDv7 (memory.go: !isV7;
// idempotency.ValidateKey accepts such IDs: "well formed but lies outside
// every store's horizon"), which has no creation time at all: a trusted
// non-Go peer minting its own IDs is told to look at the store's TTL and
// its clocks, which cannot help. The message should name the actual cause.
func TestServerUnverifiableMsg(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAttemptStore(memoryStore(t)))...)
	c := testingv1.NewTestServiceClient(end.DialT(t))
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=order-42;c=0;t=1")
	_, err := c.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
	require.Error(t, err)
	msg := grpcstatus.Convert(err).Message()
	require.NotContains(t, msg, "created longer ago than the store keeps records",
		"an attempt ID with no time (not a UUIDv7) is refused with a cause that does not apply: %q", msg)
}

// DESIGN.md §3.1: PerTryTimeout only stops the *client* waiting; with a record
// store the handler runs detached with deadline exactly d + skew, and the
// owner learns the outcome by querying. A recorded try whose per-try timeout
// is shorter than the class's expected service time, but whose attempt has
// ample time left, must therefore be admitted: its handler's deadline is
// d + skew, not the client's per-try wait. The server gives admission the
// grpc-timeout (in.until) instead, so every try is refused
// DEADLINE_UNREACHABLE and the call never runs although it fits.
func TestRecordedTryAdmittedByItsHandlerDeadline(t *testing.T) {
	for _, perTry := range []time.Duration{0, 200 * time.Millisecond} {
		t.Run(perTry.String(), func(t *testing.T) { recordedTryAdmitted(t, perTry) })
	}
}

func recordedTryAdmitted(t *testing.T, perTry time.Duration) {
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4, ExpectedServiceTime: time.Second}),
		admission.WithDefaultClass("work"),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })

	ledger := newLedger(nil) // answers at once
	end := mintedServer(t, &ledger.Service, memoryStore(t),
		interceptor.WithAdmission(ctrl), interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(20*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: perTry,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...))
	resp, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	require.NoError(t, err, "a try with 20 s of attempt left and a 1 s expected service time fits: kind=%v reason=%v err=%v",
		o.Kind, status.ReasonName(o.Reason), err)
	require.Equal(t, int64(1), resp.GetTotal())
	require.Equal(t, int64(1), ledger.effects.Load())
}

// A review found that the first fix gives admission the attempt's deadline (d + skew) for a recorded
// unary try, because its *handler* runs detached until then. But the try's
// wait in the admission queue is not detached: it ends with the client's
// context (its per-try grpc-timeout). A try whose predicted wait (≈2 s
// behind a running request) far exceeds its own 300 ms timeout is now queued
// rather than refused DEADLINE_UNREACHABLE: it can never start, its client
// gets no typed refusal and no retry-after (only its own DEADLINE_EXCEEDED,
// an UNKNOWN that needs a FenceAttempt to resolve), and the controller counts
// a DEADLINE_EXPIRED drop (a dequeue deadline miss, overload) for a request
// whose deadline, as admission was told, was 20 s away.
func TestDetachedTryQueuedPastItsOwnWait(t *testing.T) {
	var (
		mu     sync.Mutex
		events []admission.Event
	)
	ended := make(chan struct{}, 16) // a request left unrun: refused, or dropped from the queue
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: 2 * time.Second}),
		admission.WithDefaultClass("work"),
		admission.WithObserver(func(e admission.Event) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
			if e.Kind == admission.EventRefused || e.Kind == admission.EventDropped {
				ended <- struct{}{}
			}
		}),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })

	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	ledger := newLedger(func(ctx context.Context, r *testingv1.ApplyRequest) {
		if r.GetKey() == "hold" {
			entered <- struct{}{}
			<-release
		}
	})
	end := mintedServer(t, &ledger.Service, memoryStore(t),
		interceptor.WithAdmission(ctrl), interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0))
	client := testingv1.NewTestServiceClient(end.DialT(t)) // raw gRPC: the test plays the owner

	send := func(ctx context.Context, key string, perTry time.Duration) error {
		id, err := interceptor.StartAttempt(t.Context(), 0, 20*time.Second)
		require.NoError(t, err)
		a, _ := interceptor.AttemptFromContext(id)
		ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", "a="+a.ID+";c=0;t=1;d="+itoa(a.Deadline.UnixMilli()))
		ctx, cancel := context.WithTimeout(ctx, perTry)
		defer cancel()
		_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: key, Amount: 1})
		return err
	}
	holdDone := make(chan error, 1)
	go func() { holdDone <- send(context.Background(), "hold", 15*time.Second) }()
	<-entered // "hold" runs and holds work's only slot

	err = send(t.Context(), "late", 300*time.Millisecond)
	// Let the server finish with "late" (refused at arrival, or dropped
	// when its context ends) before "hold" frees the slot.
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
	}
	close(release)
	require.NoError(t, <-holdDone)

	mu.Lock()
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind.String()+"/"+status.ReasonName(e.Reason))
	}
	mu.Unlock()
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonDeadlineUnreachable, o.Reason,
		"a try predicted to wait ~2 s with 300 ms of its own to wait must be refused DEADLINE_UNREACHABLE at once; got kind=%v reason=%v err=%v; controller events %v",
		o.Kind, status.ReasonName(o.Reason), err, kinds)
}

// A store that waits for replicas needs time for the wait (Redis answers a
// WAIT up to one serverCron tick late), and sends nothing for a try with too
// little time left. The try is refused NOT_ADMITTED DEADLINE_UNREACHABLE — it
// cannot fit the store's work, as admission refuses a try that cannot fit
// its service time — rather than STORE_UNAVAILABLE, which said the store was
// down. It is final only when the attempt's own time left could not fit the
// store's work either; a try cut short by its per-try timeout is not (a
// later try may be given more). Nothing is written and the handler does not
// run.
func TestStoreWithTooLittleTimeRefusesDeadlineUnreachable(t *testing.T) {
	c, prefix := killRedis(t)
	ctx := context.Background()
	cfg, err := c.ConfigGet(ctx, "hz").Result()
	require.NoError(t, err)
	hz, err := strconv.Atoi(cfg["hz"])
	require.NoError(t, err)
	tick := time.Second / time.Duration(hz)
	// The store needs two ticks and 2 ms. Each try is given as much of that
	// as still falls short, so that a loaded machine has all of it for the
	// round trip: two ticks when the per-try timeout is short; when the
	// attempt is, two ticks less the server's skew, since the refusal is
	// final only if the attempt's time left with the skew falls short too.
	require.GreaterOrEqual(t, tick, 20*time.Millisecond, "the test needs Redis's default hz (10), not %d", hz)
	require.Greater(t, 2*tick, killSkew, "the attempt must have some time")

	store, err := redisstore.New(ctx, c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(killPolicy(killSkew)),
		redisstore.WithReplicas(1, 50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() }) // after the server's stop (cleanups run last first)
	var ran atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		ran.Add(1)
		return &testingv1.ApplyResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.TCP, svc.Register, killServerOptions(store, killSkew)...)
	for _, tc := range []struct {
		name    string
		attempt time.Duration
		perTry  time.Duration
		final   bool
	}{
		{"the attempt's time is too short", 2*tick - killSkew, 0, true},
		{"the try's time is too short", 10 * tick, 2 * tick, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := end.DialT(t, interceptor.DialOptions(
				interceptor.WithAttemptTimeout(tc.attempt),
				interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1, PerTryTimeout: tc.perTry}))...)
			connectNow(t, conn)
			client := testingv1.NewTestServiceClient(conn)
			_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.Equal(t, status.ReasonDeadlineUnreachable, o.Reason, "%v", err)
			require.Equal(t, tc.final, o.Final(), "%v", err)
			require.ErrorContains(t, err, "too little time", "the server's refusal, not the client's own")
			require.Zero(t, ran.Load(), "the handler did not run")

			keys, err := c.Keys(ctx, prefix+"*").Result()
			require.NoError(t, err)
			require.Empty(t, keys, "nothing was written, not even the tenant's horizon")
		})
	}
}

// A server that does not trust its caller (the default) re-addresses every
// refusal to the attempt it minted; the lenient client cannot match it to
// the try it sent and holds the grant; the origin's retry is then refused
// locally for lack of units, though nothing was spent.
var srvOpts = interceptor.ServerOptions(interceptor.WithClockSkew(0))

func TestUntrustedRefusalHoldsGrantForever(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if runs.Add(1) == 1 {
			return nil, shed()
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, srvOpts...) // default: untrusted
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	ledger, _ := budget.FromContext(ctx)
	t.Logf("runs=%d err=%v ledger=%+v", runs.Load(), err, ledger.Snapshot())
	require.NoError(t, err, "a SHED refusal without effect is retried")
	require.Zero(t, ledger.Snapshot().Held, "§2.3: a refusal that proves no effect refunds the grant; nothing can ever reconcile this hold")
}

// With a store, a stream's handler still sees the client's cancellation: a
// watch the caller cancels ends and gives its admission slot back, instead of
// running until the attempt's deadline.
func TestCancelledChatKeepsItsSlot(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	store := memoryStore(t)
	require.NoError(t, err)
	exited := make(chan time.Time, 1)
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		defer func() { exited <- time.Now() }()
		if _, err := st.Recv(); err != nil {
			return err
		}
		if err := st.Send(&testingv1.ChatResponse{}); err != nil {
			return err
		}
		<-st.Context().Done() // the usual watch loop: wait for events or the caller leaving
		return st.Context().Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(store))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	actx, err := interceptor.StartAttempt(t.Context(), 4, 4*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(actx)
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{}))
	_, err = st.Recv()
	require.NoError(t, err)
	cancel()
	// The attempt's deadline is 4 s away; the handler must see the cancel
	// long before (the bound only stops a hung test), and give its slot back.
	require.Eventually(t, func() bool { return len(exited) == 1 }, 3*time.Second, time.Millisecond,
		"the handler saw the caller cancel before the attempt's deadline")
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Running == 0 }, 3*time.Second, time.Millisecond)
}

// TestFinalRefusalTellsGRPCRetryToStop: a final refusal that suggests no
// delay sends grpc-retry-pushback-ms "-1", which grpc-go's own retry reads
// as "do not retry" (gRFC A6), so a plain client whose service config
// repeats RESOURCE_EXHAUSTED stops at once; before, it sent none, and the
// client repeated a refusal that no repeat could change. The same refusal
// without Final is repeated, so the plain client's retry is live.
func TestFinalRefusalTellsGRPCRetryToStop(t *testing.T) {
	svc := &testsvc.Service{
		GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return nil, status.NotAdmitted(status.ReasonTenantLimit, status.Final())
		},
		PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonTenantLimit, status.WithRetryAfter(time.Millisecond)))
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	const sc = `{"methodConfig":[{"name":[{"service":"tollgate.testing.v1.TestService"}],
		"retryPolicy":{"maxAttempts":4,"initialBackoff":"0.001s","maxBackoff":"0.001s","backoffMultiplier":1,"retryableStatusCodes":["RESOURCE_EXHAUSTED"]}}]}`
	plain := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithDefaultServiceConfig(sc)))

	var trailer metadata.MD
	_, err := plain.Get(t.Context(), &testingv1.GetRequest{}, grpc.Trailer(&trailer))
	require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(err), "%v", err)
	require.True(t, status.IsFinal(err))
	require.Equal(t, []string{"-1"}, trailer.Get(status.PushbackKey))
	require.Equal(t, int64(1), svc.Calls("Get"), "grpc-go's retry does not repeat a final refusal")

	_, err = plain.Put(t.Context(), &testingv1.PutRequest{})
	require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(err), "%v", err)
	require.Equal(t, int64(4), svc.Calls("Put"), "the same refusal, not final, is repeated by the plain client's retry")
}

// A final NOT_ADMITTED that carries a retry-after says "this
// attempt is over, a new one can succeed after the delay" (the owner's
// ATTEMPT_UNVERIFIABLE on a per-run key's first try: README, "a new attempt
// can succeed, after that retry-after"). A server that mints the attempt of
// a plain caller (no tollgate header) and passes that refusal up
// (status.WithoutEffect) sent grpc-retry-pushback-ms "-1" in a first
// version of the final refusals' "-1", a review found: the plain
// caller's grpc-go retry, whose repeat is exactly such a new attempt (the
// server mints one per request), is told never to come back, while the
// same status's RetryInfo tells it when to. The trailer is the delay.
func TestFinalRefusalWithADelayKeepsItsPushback(t *testing.T) {
	const skew = time.Minute // a new attempt is inside the store's young window
	p := idempotency.DefaultPolicy()
	p.Skew = skew
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	dep := newLedger(nil)
	depEnd := mintedServer(t, &dep.Service, store, interceptor.WithClockSkew(skew), interceptor.WithTrustedPeer(interceptor.TrustAll))
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions()...))

	mid := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		resp, err := depClient.Apply(ctx, r)
		if err != nil {
			return nil, status.WithoutEffect(err) // nothing ran below: pass the refusal up
		}
		return resp, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(midEnd.DialT(t)) // no tollgate: mid mints each request's attempt

	var trailer metadata.MD
	_, err = plain.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1}, grpc.Trailer(&trailer))
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
	require.True(t, o.Final())
	ra, ok := status.RetryAfter(err)
	require.True(t, ok && ra > 0, "the refusal says when a new attempt can succeed")
	require.Zero(t, dep.effects.Load())

	vs := trailer.Get(status.PushbackKey)
	require.Len(t, vs, 1)
	ms, perr := strconv.ParseInt(vs[0], 10, 64)
	require.NoError(t, perr)
	require.Positive(t, ms, "grpc-retry-pushback-ms %q forbids the new attempt the RetryInfo (%v) invites", vs[0], ra)
}

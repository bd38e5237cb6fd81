package interceptor_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	grpcstatus "google.golang.org/grpc/status"
)

// slotHolder holds a class's only slot for a test: its handlers (get,
// apply) keep a request whose key is "hold" running, and so its admission
// permit held, until free is called; any other key is answered at once.
type slotHolder struct {
	entered chan struct{} // closed once the holding request's handler runs
	release chan struct{} // closed by free: the holding handler returns
	done    chan error    // the holding call's result
}

func newSlotHolder() *slotHolder {
	return &slotHolder{entered: make(chan struct{}), release: make(chan struct{}), done: make(chan error, 1)}
}

func (h *slotHolder) get(_ context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
	if r.GetKey() == "hold" {
		close(h.entered)
		<-h.release
	}
	return &testingv1.GetResponse{}, nil
}

func (h *slotHolder) apply(_ context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
	if r.GetKey() == "hold" {
		close(h.entered)
		<-h.release
	}
	return &testingv1.ApplyResponse{}, nil
}

// holdGet sends the holding Get through client (with ctx) and returns once
// its handler runs: the slot is taken.
func (h *slotHolder) holdGet(ctx context.Context, client testingv1.TestServiceClient) {
	go func() {
		_, err := client.Get(ctx, &testingv1.GetRequest{Key: "hold"})
		h.done <- err
	}()
	<-h.entered
}

// holdApply is holdGet with an Apply.
func (h *slotHolder) holdApply(ctx context.Context, client testingv1.TestServiceClient) {
	go func() {
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "hold"})
		h.done <- err
	}()
	<-h.entered
}

// free lets the holding handler return and gives the holding call's result.
func (h *slotHolder) free() error {
	close(h.release)
	return <-h.done
}

// TestAdmissionRefusalsNameTheTryAndRefundTheGrant: with the only slot held,
// further calls are refused (by the tap or by the interceptor's admission
// step) with a typed refusal that names the attempt, call and try sent, so a
// lenient client refunds the grant it lent, and the pushback trailer is set.
func TestAdmissionRefusalsNameTheTryAndRefundTheGrant(t *testing.T) {
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "work", Slots: 1}),
		admission.WithDefaultClass("work"),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })

	h := newSlotHolder()
	svc := &testsvc.Service{GetFunc: h.get}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	h.holdGet(t.Context(), client)

	for range 3 {
		ctx, err := interceptor.StartAttempt(t.Context(), 5, 5*time.Second)
		require.NoError(t, err)
		a, _ := interceptor.AttemptFromContext(ctx)
		var trailer metadata.MD
		_, err = client.Get(ctx, &testingv1.GetRequest{}, grpc.Trailer(&trailer))
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind)
		require.Equal(t, status.ReasonConcurrencyFull, o.Reason)
		require.Equal(t, "work", o.Detail.GetWorkloadClass())
		require.Equal(t, a.ID, o.Detail.GetAttemptId(), "the refusal names the attempt")
		require.Equal(t, "0", o.Detail.GetCall())
		require.Equal(t, uint32(1), o.Detail.GetTry())
		ledger, _ := budget.FromContext(ctx)
		snap := ledger.Snapshot()
		require.Equal(t, int64(5), snap.Free, "the grant came back: the refusal proves nothing was spent")
		require.Zero(t, snap.Held)
	}
	require.NoError(t, h.free())
	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err, "admission recovers once the slot is free")
}

// TestMalformedHeaderRefusedAtTheTapIsNotCounted: DESIGN.md §2.1 says a
// malformed tollgate header, trusted peer or not, "is counted in a metric"
// (tollgate.metadata.malformed). The admission tap parses a trusted peer's
// header and, when it is malformed, silently drops it; when the class is
// full the tap then refuses the request (CONCURRENCY_FULL) and the
// interceptor, the only place that counts malformed headers, never runs. So
// under overload — when operators look — malformed headers go uncounted
// (and the trusted peer gets a repeatable RESOURCE_EXHAUSTED instead of the
// final INVALID_ARGUMENT MALFORMED_HEADER).
func TestMalformedHeaderRefusedAtTheTapIsNotCounted(t *testing.T) {
	mp, reader := testMeter(t)
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })

	h := newSlotHolder()
	svc := &testsvc.Service{GetFunc: h.get}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithServerMeterProvider(mp))...)
	client := testingv1.NewTestServiceClient(end.DialT(t)) // a plain client: the header is the test's
	h.holdGet(t.Context(), client)                         // the one slot is taken

	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x y")
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	require.NoError(t, h.free())
	require.Error(t, err)
	t.Logf("the trusted peer's malformed request was answered: %v (reason %v)", err, status.OutcomeOf(err).Reason)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, int64(1), counter(rm, "tollgate.metadata.malformed"),
		"a trusted peer's malformed header refused at the tap is not counted")
}

// R62: WithTenant's function may name a tenant with any string; a name that
// is not a valid token is used as "h." and 40 hex digits of its SHA-256, to
// "keep its records apart". But a valid token is used as it is, so a tenant
// whose name is literally that digest ("h.<40 hex>", itself a valid token)
// shares the hashed tenant's records: it reads (and could fence) them
// (DESIGN.md §3.11: another tenant's attempt reads as UNSEEN to them).
func TestHashedTenantCollidesWithLiteralToken(t *testing.T) {
	const alice = "alice@example.com" // not a token: hashed
	sum := sha256.Sum256([]byte(alice))
	mallory := "h." + hex.EncodeToString(sum[:20]) // a valid token, used as is

	ledger := newLedger(nil)
	store := memoryStore(t)
	tenantOf := func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-tenant"); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithTenant(tenantOf))...)
	conn := end.DialT(t) // raw gRPC: the test writes the header
	client := testingv1.NewTestServiceClient(conn)
	attempts := tollgatev1.NewAttemptServiceClient(conn)

	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	hdr := "a=" + a.ID + ";c=0;t=1;d=" + itoa(a.Deadline.UnixMilli())

	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", hdr, "x-tenant", alice)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	require.NoError(t, err)

	// Alice sees her own record.
	own, err := attempts.GetAttempt(metadata.AppendToOutgoingContext(t.Context(), "x-tenant", alice),
		&tollgatev1.GetAttemptRequest{AttemptId: a.ID, Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, own.GetState())

	// Another tenant, whose name happens to be alice's digest, must not.
	other, err := attempts.GetAttempt(metadata.AppendToOutgoingContext(t.Context(), "x-tenant", mallory),
		&tollgatev1.GetAttemptRequest{AttemptId: a.ID, Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, other.GetState(),
		"tenant %q reads tenant %q's record: %v", mallory, alice, other)
}

// r91SlowStore is a store whose reads wait for gate: a slow store (a Redis
// that WAITs for replicas, a failover in progress).
type r91SlowStore struct {
	idempotency.Store
	gate chan struct{}
}

func (s *r91SlowStore) Get(ctx context.Context, k idempotency.Key) (*tollgatev1.AttemptRecord, error) {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.Get(ctx, k)
}

// Review 91, DESIGN §3.12 (the control path stays open): health checks
// share the control class's two slots and eight places with AttemptService
// queries, each of which holds its slot for as long as the store takes to
// answer. With the store slow, ten GetAttempt calls (from any peer: no trust
// is needed to read) fill the class, and the health check — which touches no
// store — is refused RESOURCE_EXHAUSTED QUEUE_FULL (with two of them, it
// waits behind the store). An orchestrator then restarts a server whose
// data path may be perfectly healthy. Expected: the health check answers.
func TestHealthStarvedBySlowAttemptQueries(t *testing.T) {
	ctrl, err := admission.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	mem := memoryStore(t)
	store := &r91SlowStore{Store: mem, gate: make(chan struct{})}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		healthpb.RegisterHealthServer(s, health.NewServer())
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithClockSkew(0), interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(mem))...)
	conn := end.DialT(t)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(store.gate)
	for range 10 {
		wg.Go(func() {
			_, _ = tollgatev1.NewAttemptServiceClient(conn).GetAttempt(t.Context(),
				&tollgatev1.GetAttemptRequest{AttemptId: "x", Call: "0", Method: "/m.S/M"})
		})
	}
	require.Eventually(t, func() bool { // the queries wait on the store
		c, _ := ctrl.Stats().Class(admission.ControlClass)
		return c.Running == 2 && c.Queued == 8
	}, 10*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // only stops a starved (hung) check
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "§3.12: health answers while AttemptService queries wait on a slow store")
}

// Control streams (a reflection session, a health Watch) take no admission
// slot in the interceptor (server.control: "Streams on the control path take
// no slot"), so a full control class cannot delay them. But the admission
// tap classifies reflection as a control method and refuses it QUEUE_FULL
// whenever the control class's slots and queue are taken by AttemptService
// queries: an operator's reflection session is refused for want of a slot
// it would never have used.
func TestTapDoesNotRefuseSlotlessControlStreams(t *testing.T) {
	queued := make(chan struct{}, 16)
	ctrl, err := admission.New(admission.WithObserver(func(e admission.Event) {
		if e.Kind == admission.EventQueued {
			queued <- struct{}{}
		}
	}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { reflection.Register(s) },
		serverOpts(interceptor.WithAdmission(ctrl))...)

	// AttemptService queries fill the control class: 2 running, 8 waiting.
	q := admission.Request{Method: "/tollgate.v1.AttemptService/GetAttempt", Size: -1}
	for range 2 {
		p, err := ctrl.Admit(t.Context(), q)
		require.NoError(t, err)
		defer p.Release()
	}
	wctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{}, 8)
	defer func() {
		cancel()
		for range 8 {
			<-done
		}
	}()
	for range 8 {
		go func() {
			if p, err := ctrl.Admit(wctx, q); err == nil {
				p.Release()
			}
			done <- struct{}{}
		}()
		<-queued
	}

	ctx, cc := context.WithTimeout(t.Context(), 5*time.Second)
	defer cc()
	st, err := rpb.NewServerReflectionClient(end.DialT(t)).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}))
	_, err = st.Recv()
	require.NoError(t, err, "a reflection session takes no control slot, yet it was refused %s",
		status.ReasonName(status.OutcomeOf(err).Reason))
}

// The server keeps records and its only slot is held. A trusted peer's try
// whose attempt deadline has passed is let through by the interceptor's tap
// (its record, not admission, answers it), but only after the tap asked
// Controller.TapHandle, which already counted a CONCURRENCY_FULL refusal —
// in Stats, in tollgate.admission.decisions and in the degradation window —
// for a request that was never refused with that reason: the caller gets
// the store's answer (DEADLINE_EXPIRED here), and admission is not even
// consulted by the interceptor for it.
func TestTapLetThroughLateTryIsNotCountedAsRefused(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	store := memoryStore(t)
	h := newSlotHolder()
	svc := &testsvc.Service{ApplyFunc: h.apply}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	h.holdApply(t.Context(), client)
	defer func() { require.NoError(t, h.free()) }()

	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	d := time.Now().Add(-time.Second) // the attempt's deadline has passed
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
		"a="+a.ID+";d="+strconv.FormatInt(d.UnixMilli(), 10)+";c=late;t=2")
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "late"})
	o := status.OutcomeOf(err)
	require.NotEqual(t, status.ReasonConcurrencyFull, o.Reason, "the late try is answered past the tap: %v", err)

	s, _ := ctrl.Stats().Class("work")
	require.Zero(t, s.Refused["CONCURRENCY_FULL"],
		"the caller was answered %s by the store, never refused CONCURRENCY_FULL, yet admission counted it (refused %v)",
		status.ReasonName(o.Reason), s.Refused)
}

// A tollgate client the server does not trust: its header is ignored, and
// the server interceptor tells it so on every answer (tollgate-spent: 0) so
// that its lenient ledger does not hold the grant it lent "with no record to
// reconcile them" (server.begin). A refusal by the admission tap carries no
// trailer and, for an untrusted peer, no attempt/call/try either, so the
// client cannot tell the refusal answers its very try: it holds the grant,
// and nothing ever reconciles it. Each refused call leaks its grant from the
// attempt's allowance.
func TestUntrustedTapRefusalLeaksTheGrant(t *testing.T) {
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "work", Slots: 1}),
		admission.WithDefaultClass("work"),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })

	h := newSlotHolder()
	svc := &testsvc.Service{GetFunc: h.get}
	// No WithTrustedPeer: no peer is trusted (the default).
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		interceptor.ServerOptions(interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(0))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	h.holdGet(t.Context(), client)
	defer func() { require.NoError(t, h.free()) }()

	ctx, err := interceptor.StartAttempt(t.Context(), 5, 5*time.Second)
	require.NoError(t, err)
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	t.Logf("refusal %v (detail attempt %q); ledger %+v", status.ReasonName(o.Reason), o.Detail.GetAttemptId(), snap)
	require.Zero(t, snap.Held, "the refused try used none of the grant (an untrusted caller's grant is never used), yet it is held with no record to reconcile it")
}

// DESIGN.md §2.3: tollgate-spent is sent "when > 0, or when the request
// carried r=1", and server.begin refuses a late try "with the inbound, so the
// refusal still reports tollgate-spent to a strict caller". Since af67236 the
// admission tap decides a trusted peer's late try first: on a server without
// a store it refuses DEADLINE_EXPIRED itself, where no trailer can be set,
// although admission had room and the interceptor would have answered with
// tollgate-spent: 0. A strict caller (which counts a completed call without
// the trailer as spent until reconciled, and has no store to reconcile with)
// now holds the grant it lent to a try that provably ran nothing.
func TestTapLateTryLosesStrictSpentTrailer(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	svc := &testsvc.Service{}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) },
		serverOpts(interceptor.WithAdmission(ctrl))...) // no store
	client := testingv1.NewTestServiceClient(end.DialT(t))

	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	d := time.Now().Add(-time.Second) // the attempt's deadline has passed
	ctx := metadata.AppendToOutgoingContext(context.Background(), "tollgate",
		"a="+a.ID+";d="+strconv.FormatInt(d.UnixMilli(), 10)+";c=0;t=1;u=3;r=1")
	var trailer metadata.MD
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "late"}, grpc.Trailer(&trailer))
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
	require.Equal(t, []string{"0"}, trailer.Get("tollgate-spent"),
		"a strict (r=1) late try refused DEADLINE_EXPIRED must report tollgate-spent 0; trailer %v", trailer)
}

// R5: with a recording server span (e.g. otelgrpc), every admission refusal
// dereferences a nil *Permit in server.admit (p.Class() before err check).
func TestAdmitRefusalWithRecordingSpanDoesNotPanic(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctrl.Close() })
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	spanInt := grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, sp := tp.Tracer("t").Start(ctx, info.FullMethod)
		defer sp.End()
		return h(ctx, req)
	})
	h := newSlotHolder()
	svc := &testsvc.Service{GetFunc: h.get}
	opts := append([]grpc.ServerOption{spanInt}, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap())...)
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, opts...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	h.holdGet(t.Context(), client)
	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	_ = h.free()
	if o := status.OutcomeOf(err); o.Reason != status.ReasonConcurrencyFull {
		t.Fatalf("want CONCURRENCY_FULL, got %v", err)
	}
}

// R4 end to end: one 1.5s Watch stream in the default class teaches the class
// a 1.5s service time; every later unary call with a 1s deadline to the idle
// server is refused DEADLINE_UNREACHABLE, so nothing completes and the
// estimate never recovers.
func TestStreamDoesNotPoisonUnaryClass(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 8, QueueItems: 8}), admission.WithDefaultClass("work"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctrl.Close() })
	svc := &testsvc.Service{
		GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return &testingv1.GetResponse{}, nil
		},
		WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			time.Sleep(1500 * time.Millisecond)
			return nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	ws, err := client.Watch(t.Context(), &testingv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := ws.Recv(); err != nil {
			break
		}
	}
	fails := 0
	var last error
	for range 10 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := client.Get(ctx, &testingv1.GetRequest{})
		cancel()
		if err != nil {
			fails++
			last = err
		}
	}
	if fails > 0 {
		t.Fatalf("%d/10 unary calls (1s deadline, idle server) refused after one 1.5s stream: %v", fails, last)
	}
}

// A trusted peer's malformed tollgate header is refused MALFORMED_HEADER on
// the data path, and was silently ignored on the control path: the
// AttemptService query ran under the server's tenant function instead of
// being refused (DESIGN §2.1), and was not counted as malformed (found by
// review).
func TestControlPathRefusesTrustedMalformedHeader(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	conn := end.DialT(t)
	bad := metadata.AppendToOutgoingContext(context.Background(), "tollgate", "a=x;n=a", "tollgate", "a=x;n=b") // repeated header
	_, err := testingv1.NewTestServiceClient(conn).Apply(bad, &testingv1.ApplyRequest{Key: "k"})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err))
	require.Equal(t, status.ReasonMalformedHeader, status.OutcomeOf(err).Reason)

	_, err = tollgatev1.NewAttemptServiceClient(conn).FenceAttempt(bad, &tollgatev1.FenceAttemptRequest{
		AttemptId: "01a22bcd-4490-7a20-a651-a5fcfed10e60", Call: "0", Method: "/x.Y/Z", FenceThroughTry: 1})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "the same header on FenceAttempt: %v", err)
	require.Equal(t, status.ReasonMalformedHeader, status.OutcomeOf(err).Reason)
	require.True(t, status.IsFinal(err))
}

// Two long-lived Health/Watch streams (what grpc-go clients with
// healthCheckConfig open, one per subchannel) hold the control class's two
// slots for their lifetime: FenceAttempt can no longer be answered.
var nWatch = 2

func TestHealthWatchStarvesControlClass(t *testing.T) {
	ctrl, err := admission.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	store := memoryStore(t)
	require.NoError(t, err)
	hs := health.NewServer()
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		healthpb.RegisterHealthServer(s, hs)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(store))...)
	conn := end.DialT(t, interceptor.DialOptions()...)
	wctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range nWatch {
		w, err := healthpb.NewHealthClient(conn).Watch(wctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = w.Recv()
		require.NoError(t, err)
	}
	qctx, qcancel := context.WithTimeout(t.Context(), 10*time.Second) // only stops a starved (hung) query
	defer qcancel()
	_, err = tollgatev1.NewAttemptServiceClient(conn).GetAttempt(qctx, &tollgatev1.GetAttemptRequest{AttemptId: "x", Call: "0", Method: "/m/m"})
	require.NoError(t, err, "§3.12: the control path stays open")
}

// queueScene: class work (1 slot, 1 queue place, 100ms expected service);
// A holds the slot; B (600ms timeout) is queued: at arrival it could finish
// (predicted wait ≈100ms + 100ms service < 600ms). A then overruns, so from
// 500ms on B can no longer finish in time.
func queueScene(t *testing.T, tap bool) (client testingv1.TestServiceClient, ctrl *admission.Controller, bErr chan error, release func()) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	h := newSlotHolder()
	svc := &testsvc.Service{ApplyFunc: h.apply}
	opts := []interceptor.ServerOption{interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(0)}
	if !tap {
		opts = append(opts, interceptor.WithoutAdmissionTap())
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(opts...)...)
	client = testingv1.NewTestServiceClient(end.DialT(t))
	h.holdApply(context.Background(), client)
	bErr = make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 600*time.Millisecond)
		defer cancel()
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "b"})
		bErr <- err
	}()
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Queued == 1 }, 5*time.Second, time.Millisecond)
	once := false
	release = func() {
		if !once {
			once = true
			require.NoError(t, h.free())
		}
	}
	t.Cleanup(release)
	return client, ctrl, bErr, release
}

// A queued request whose deadline could no longer be met was not refused
// early: it sat in the queue until its context ended and its caller saw a
// bare DEADLINE_EXCEEDED (after which a tollgate owner must resolve an
// UNKNOWN), not NOT_ADMITTED (found by review). A waiter now gives up by a
// timer of its own once it can no longer finish.
func TestQueuedRequestIsRefusedOnceItCannotFinish(t *testing.T) {
	_, _, bErr, _ := queueScene(t, false)
	err := <-bErr
	st, _ := grpcstatus.FromError(err)
	t.Logf("B: %v outcome %+v", err, status.OutcomeOf(err))
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind,
		"B waited in the queue until its deadline: got %v (code %v), want an early NOT_ADMITTED", err, st.Code())
}

// The tap and Admit disagreed while the queue's only place was held by a
// waiter that could no longer finish: Admit dropped it and queued the
// newcomer (TestExpiredWaiterHoldsQueue), the tap refused
// QUEUE_FULL (found by review). The waiter now leaves the queue by itself.
func TestTapAndAdmitAgreeBehindAWaiterThatCannotFinish(t *testing.T) {
	for _, tap := range []bool{false, true} {
		t.Run("tap="+strconv.FormatBool(tap), func(t *testing.T) {
			client, _, bErr, release := queueScene(t, tap)
			// B gives up once it can no longer finish (it needs 100 ms),
			// before its own deadline: it left the queue by itself. (A
			// fixed sleep before C raced the give-up timer on a loaded
			// machine.)
			berr := <-bErr
			require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(berr).Kind, "B waited until its deadline: %v", berr)
			cErr := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "c"})
				cErr <- err
			}()
			select {
			case err := <-cErr:
				require.NoError(t, err, "C refused while the only queue place is held by a dead waiter (reason %v)", status.OutcomeOf(err).Reason)
			case <-time.After(200 * time.Millisecond):
				release()
				require.NoError(t, <-cErr)
			}
		})
	}
}

// The same through tollgate's own client, against a server without a record
// store: the try that never ran was returned to the caller as UNKNOWN (the
// worst answer tollgate gives), because the server kept it queued until the
// client's per-try timeout instead of refusing it once it could no longer
// finish (found by review).
func TestQueuedTryThatNeverRanIsNotAdmittedAtTollgateClient(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	h := newSlotHolder()
	var bRuns atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if r.GetKey() != "hold" {
			bRuns.Add(1)
		}
		return h.apply(ctx, r)
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap())...)
	raw := testingv1.NewTestServiceClient(end.DialT(t))
	h.holdApply(context.Background(), raw)
	defer func() { require.NoError(t, h.free()) }()
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(2*time.Second), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "b"})
	t.Logf("B: %v outcome %+v", err, status.OutcomeOf(err))
	require.Zero(t, bRuns.Load())
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "a try that never ran, kept queued until the client gave up, ends %v", status.OutcomeOf(err).Kind)
}

// AdmissionTap(ctrl) — the call form every composed tap used before it took
// options, which still compiles — read default options (30s maximum attempt
// time) while the server's interceptors read WithMaxAttemptTime(2m): the tap
// bounded the stream's context at 30.5s, cutting off a 31s call the server
// allows (found by review). Without options the tap bounds nothing: the
// handler's deadline is the caller's.
func TestAdmissionTapWithoutOptionsBoundsNothing(t *testing.T) {
	ctrl, err := admission.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	deadlines := make(chan time.Time, 1)
	svc := &testsvc.Service{
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			d, _ := ctx.Deadline()
			deadlines <- d
			return &testingv1.ApplyResponse{}, nil
		},
	}
	opts := []interceptor.ServerOption{interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap(),
		interceptor.WithMaxAttemptTime(2 * time.Minute)}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		append(interceptor.ServerOptions(opts...), grpc.InTapHandle(interceptor.AdmissionTap(ctrl)))...)
	c := testingv1.NewTestServiceClient(end.DialT(t))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err = c.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
	require.NoError(t, err)
	d := <-deadlines
	require.Greater(t, d.Sub(start), 50*time.Second,
		"the handler's deadline is the caller's minute, which the server's 2m maximum allows, not the tap's default 30s")
}

// The tap created its bounded context (a timer) before asking the
// controller, and on a refusal grpc-go drops the returned context without
// cancelling the stream's context (http2_server.go operateHeaders: the tap
// error path returns without s.cancel()): each refused request kept a live
// timer and its contexts (metadata included) until the bound, so memory grew
// with the refusal rate under overload (found by review). The bound is now
// made only for a request the tap lets in.
func TestTapRefusalsDoNotRetainMemory(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	block := make(chan struct{})
	svc := &testsvc.Service{
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			<-block
			return &testingv1.ApplyResponse{}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(interceptor.WithAdmission(ctrl))...)
	c := testingv1.NewTestServiceClient(end.DialT(t))
	go func() { _, _ = c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "hold"}) }()
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Running == 1 }, 5*time.Second, time.Millisecond)
	defer close(block)

	refuse := func(n int) {
		for range n {
			_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "x"})
			require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "%v", err)
		}
	}
	refuse(200) // warm up
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	const n = 5000
	refuse(n)
	after := heap()
	per := (int64(after) - int64(before)) / n
	t.Logf("retained per refused request: %d bytes", per)
	require.Less(t, per, int64(100), "each tap refusal retains memory until the attempt bound")
}

// A try that arrives after its attempt's deadline, of a call whose record
// is finished, is answered from the record (COMMITTED here) while the
// server is full, with or without the admission tap: the tap lets a try
// whose header says its deadline has passed through to the interceptor,
// which answers it from the record without a slot. The tap refused it
// CONCURRENCY_FULL, a repeatable NOT_ADMITTED for a call that committed.
func TestLateTryOfAFinishedCallIsAnsweredFromItsRecordPastTheTap(t *testing.T) {
	for _, tap := range []bool{false, true} {
		t.Run("tap="+strconv.FormatBool(tap), func(t *testing.T) {
			ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ctrl.Close() })
			hold, release := make(chan struct{}), make(chan struct{})
			c := newConsumer()
			c.consume = func(r *testingv1.ConsumeRequest, st grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
				if r.GetKey() == "hold" {
					close(hold)
					<-release
				}
				return countingConsume(r, st)
			}
			extra := []interceptor.ServerOption{interceptor.WithAdmission(ctrl)}
			if !tap {
				extra = append(extra, interceptor.WithoutAdmissionTap())
			}
			conn := startRecorded(t, c, memoryStore(t), extra).DialT(t)
			client := testingv1.NewTestServiceClient(conn)
			actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
			require.NoError(t, err)
			a, _ := interceptor.AttemptFromContext(actx)
			d := time.Now().Add(300 * time.Millisecond)
			try := func(n int) context.Context {
				return metadata.AppendToOutgoingContext(t.Context(), "tollgate",
					"a="+a.ID+";d="+strconv.FormatInt(d.UnixMilli(), 10)+";c=feed;t="+strconv.Itoa(n)+";r=1")
			}

			st, err := client.Consume(try(1), &testingv1.ConsumeRequest{Key: "k", Count: 2})
			require.NoError(t, err)
			got, err := recvConsumed(st)
			require.NoError(t, err)
			require.Equal(t, []string{"0", "1"}, got)

			held := make(chan error, 1)
			go func() {
				st, err := client.Consume(t.Context(), &testingv1.ConsumeRequest{Key: "hold", Count: 1})
				if err == nil {
					_, err = recvConsumed(st)
				}
				held <- err
			}()
			<-hold
			defer func() { close(release); require.NoError(t, <-held) }()

			time.Sleep(time.Until(d) + 50*time.Millisecond) // past d (the test server's skew is 0)
			var trailer metadata.MD
			st, err = client.Consume(try(2), &testingv1.ConsumeRequest{Key: "k", Count: 2}, grpc.Trailer(&trailer))
			require.NoError(t, err)
			got, err = recvConsumed(st)
			require.Empty(t, got)
			require.Equal(t, status.KindCommitted, status.OutcomeOf(err).Kind, "%v", err)
			require.Equal(t, []string{"0"}, trailer.Get("tollgate-spent"))
			require.Equal(t, int64(2), c.runs.Load(), "the first try and the slot holder ran; the late try did not")
		})
	}
}

// AdmissionTap let through any request whose tollgate header claimed a past
// deadline, without asking whether the peer was trusted. The interceptor
// ignores an untrusted peer's header, so the exemption bought that peer
// nothing but a way around the tap: while the class was frozen (SHED), every
// such request had its body read and decoded (here 1 MiB) and reached Admit
// (found by review). Only a trusted peer's late try goes past the tap, and
// only to a server that keeps records.
func TestUntrustedStaleHeaderDoesNotBypassTheTap(t *testing.T) {
	var admitted atomic.Int64 // decisions Admit made (the tap's refusals make none)
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4}),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventRefused {
				admitted.Add(1)
			}
		}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	_, err = ctrl.SetOverride(t.Context(), admission.Override{Actor: "op", Reason: "test", TTL: time.Hour, Class: "work", Freeze: true})
	require.NoError(t, err)
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	// No WithTrustedPeer: every peer is untrusted.
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	big := &testingv1.ApplyRequest{Key: strings.Repeat("x", 1<<20)}

	_, err = client.Apply(t.Context(), big)
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason)
	require.Zero(t, admitted.Load(), "without a header the tap refuses before the body is read")

	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x;d=1")
	_, err = client.Apply(ctx, big)
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason)
	require.Zero(t, admitted.Load(), "an untrusted peer's stale header took its 1 MiB request past the tap to Admit")
}

// WithClassifier routes "critical" requests to their own idle class, but the
// tap ServerOptions installs by default classifies by method alone and
// refuses them while the method's class is full.
func TestTapIgnoresClassifier(t *testing.T) {
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "bulk", Slots: 1}, admission.Class{Name: "critical", Slots: 1}),
		admission.WithDefaultClass("bulk"),
		admission.WithClassifier(func(ctx context.Context, r admission.Request) string {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("crit")) > 0 {
				return "critical"
			}
			return ""
		}),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	h := newSlotHolder()
	svc := &testsvc.Service{GetFunc: h.get}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	h.holdGet(t.Context(), client)
	defer func() { _ = h.free() }()
	_, err = client.Get(metadata.AppendToOutgoingContext(t.Context(), "crit", "1"), &testingv1.GetRequest{})
	require.NoError(t, err, "the critical class is idle")
}

// A queued try dropped at dequeue because its *per-try* deadline (the
// grpc-timeout tollgate's client sets, ≈ remaining/3 here) can no longer be
// met was refused NOT_ADMITTED DEADLINE_EXPIRED with final=true. The
// attempt's deadline d was still ~1s away and the slot free, but "final"
// made the owner stop: the call failed although try 2 would succeed (found
// by review). The refusal is not final while the attempt's deadline has not
// passed.
func TestDequeueDropOfPerTryDeadlineIsNotFinal(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	h := newSlotHolder()
	var bRuns atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if r.GetKey() != "hold" {
			bRuns.Add(1)
		}
		return h.apply(ctx, r)
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	raw := testingv1.NewTestServiceClient(end.DialT(t))
	h.holdApply(context.Background(), raw)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(1500*time.Millisecond), interceptor.WithoutRetryBudget(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3}))...))
	bErr := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := client.Apply(context.Background(), &testingv1.ApplyRequest{Key: "b"})
		bErr <- err
	}()
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Queued == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(430*time.Millisecond - time.Since(start)) // per-try ≈ 500ms: B can no longer finish its try
	require.NoError(t, h.free())
	err = <-bErr
	o := status.OutcomeOf(err)
	t.Logf("B after %v: %v (final=%v)", time.Since(start), err, o.Final())
	require.NoError(t, err, "the owner gave up at %v of a 1.5s attempt on a final %v; the slot was free", time.Since(start).Round(time.Millisecond), o.Reason)
	require.Equal(t, int64(1), bRuns.Load(), "B's handler ran once: the dropped try never ran, its repeat did")
}

// A waiter dropped for a deadline that is its attempt's own (a plain client
// whose grpc-timeout the server takes for the attempt's deadline) cannot fit
// any later try either: its refusal stays final (found by review).
func TestDequeueDropOfTheAttemptsDeadlineStaysFinal(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	h := newSlotHolder()
	svc := &testsvc.Service{ApplyFunc: h.apply}
	// A skew (the default's order): the attempt's deadline plus the skew is
	// later than the grpc-timeout the server took for the attempt's deadline.
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(200*time.Millisecond))...)
	raw := testingv1.NewTestServiceClient(end.DialT(t))
	h.holdApply(context.Background(), raw)
	defer func() { require.NoError(t, h.free()) }()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err = raw.Apply(ctx, &testingv1.ApplyRequest{Key: "b"}) // queued; gives up at 400 ms
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
	require.True(t, o.Final(), "the attempt's own deadline cannot be met by any try: %v", err)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// README (Admission): "Through tollgate's interceptor a request's deadline
// is the one its handler runs until: the try's own (grpc-timeout) …"; the
// deadline stage refuses DEADLINE_UNREACHABLE when the predicted wait plus
// the learned service time passes it, and the dequeue stage drops a waiter
// that can no longer finish (DESIGN §3.9). server.control admits
// AttemptService queries with sv.admit(ctx, method, nil, req): the Request
// has no Deadline, so neither stage ever applies to the control class. A
// query with 2 s left, behind a query the class expects to take 10 s, is
// queued (to wait out its deadline) instead of refused at once.
func TestControlQueryDeadlineIgnored(t *testing.T) {
	events := make(chan admission.Event, 16)
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: admission.ControlClass, Slots: 1, QueueItems: 4,
			ExpectedServiceTime: 10 * time.Second}),
		admission.WithObserver(func(e admission.Event) {
			if e.Class == admission.ControlClass {
				events <- e
			}
		}),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	client, store := slowQueryServer(t, ctrl)
	req := &tollgatev1.GetAttemptRequest{AttemptId: "x", Call: "0", Method: "/m.S/M"}
	done := make(chan error, 2)
	defer func() {
		close(store.gate)
		for range cap(done) {
			<-done
		}
	}()
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err := client.GetAttempt(ctx, req)
		done <- err
	}()
	require.Equal(t, admission.EventAdmitted, (<-events).Kind) // the only slot, held on the slow store

	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err := client.GetAttempt(ctx, req)
		done <- err
	}()
	e := <-events
	require.Equal(t, admission.EventRefused, e.Kind,
		"a query with 2s left behind 10s of expected work must be refused DEADLINE_UNREACHABLE, not %v (the control path passes no deadline to admission)", e.Kind)
	require.Equal(t, status.ReasonDeadlineUnreachable, e.Reason)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN §2.3: grpc-retry-pushback-ms is sent "on NOT_ADMITTED refusals made
// before any header was sent"; the README: "plus the grpc-retry-pushback-ms
// trailer when the interceptor refused". The data path sets it
// (setTrailer after sv.admit), but server.control returns admission's
// refusal of an AttemptService query without any trailer: a client relying
// on grpc-go's retry gets no pushback from the control class.
func TestControlRefusalHasNoPushback(t *testing.T) {
	admitted := make(chan struct{}, 8)
	ctrl, err := admission.New(
		// A byte bound the tap does not see: the interceptor's Admit refuses.
		admission.WithClasses(admission.Class{Name: admission.ControlClass, Slots: 1, QueueItems: 4, QueueBytes: 1}),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventAdmitted && e.Class == admission.ControlClass {
				admitted <- struct{}{}
			}
		}),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	client, store := slowQueryServer(t, ctrl)
	req := &tollgatev1.GetAttemptRequest{AttemptId: "x", Call: "0", Method: "/m.S/M"}
	done := make(chan error, 1)
	defer func() {
		close(store.gate)
		<-done
	}()
	go func() {
		_, err := client.GetAttempt(t.Context(), req)
		done <- err
	}()
	<-admitted // the only control slot is held

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var trailer metadata.MD
	_, err = client.GetAttempt(ctx, req, grpc.Trailer(&trailer))
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonQueueFull, o.Reason, "%v", err)
	ra, ok := status.RetryAfter(err)
	require.True(t, ok && ra > 0, "the refusal suggests a delay")
	require.NotEmpty(t, trailer.Get(status.PushbackKey),
		"an interceptor refusal with a retry-after carries grpc-retry-pushback-ms (DESIGN §2.3); trailer %v", trailer)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// The control class's per-tenant limits are configurable like any class's
// (admission.Class{Name: ControlClass, TenantRunning: …}), and the README
// says tenant limits "apply to the tenant the interceptor resolved (a
// trusted peer's n, else interceptor.WithTenant)". But server.control
// resolves the caller's tenant (for the AttemptService) and then calls
// sv.admit(ctx, method, nil, req): with in == nil the Request carries no
// tenant, so the control class's tenant limits never apply to
// AttemptService queries. One tenant's queries on a slow store take every
// control slot and the next tenant's query is refused CONCURRENCY_FULL —
// the very starvation TenantRunning was configured to prevent (DESIGN §3.9
// "per tenant: … running ≤ limits", §3.12).
func TestControlClassTenantLimitIgnored(t *testing.T) {
	admitted := make(chan struct{}, 8)
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: admission.ControlClass, Slots: 2, TenantRunning: 1}),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventAdmitted && e.Class == admission.ControlClass {
				admitted <- struct{}{}
			}
		}),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	tenantOf := func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-tenant"); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	client, store := slowQueryServer(t, ctrl, interceptor.WithTenant(tenantOf))
	query := func(tenant string) error {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "x-tenant", tenant), 10*time.Second)
		defer cancel()
		_, err := client.GetAttempt(ctx, &tollgatev1.GetAttemptRequest{AttemptId: "x", Call: "0", Method: "/m.S/M"})
		return err
	}
	done := make(chan error, 2)
	defer func() {
		close(store.gate)
		for range cap(done) {
			<-done
		}
	}()
	go func() { done <- query("tenant-a") }()
	<-admitted // tenant-a's first query holds a control slot, waiting on the store

	go func() { done <- query("tenant-a") }()
	select {
	case err := <-done:
		done <- err // keep the count for the deferred drain
		require.Equal(t, status.ReasonTenantLimit, status.OutcomeOf(err).Reason, "%v", err)
	case <-admitted:
		t.Fatal("tenant-a runs 2 control queries over the control class's TenantRunning 1: the tenant was never passed to admission")
	}
}

// slowQueryServer serves the AttemptService behind admission ctrl (with
// opts) on a memory store whose answers wait until the returned store's
// gate is closed: a query holds its control slot until then. It returns a
// client of it.
func slowQueryServer(t *testing.T, ctrl *admission.Controller, opts ...interceptor.ServerOption) (tollgatev1.AttemptServiceClient, *r91SlowStore) {
	t.Helper()
	mem := memoryStore(t)
	store := &r91SlowStore{Store: mem, gate: make(chan struct{})}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(append([]interceptor.ServerOption{interceptor.WithClockSkew(0), interceptor.WithAdmission(ctrl),
		interceptor.WithAttemptStore(mem)}, opts...)...)...)
	return tollgatev1.NewAttemptServiceClient(end.DialT(t)), store
}

// TestDrainingKeepsTheControlPathOpen: a server drains (Controller.Close:
// later requests are refused DRAINING) while a recorded try it accepted is
// still running detached. The try's owner, whose own wait ended, asks the
// server what became of it. A review found FenceAttempt refused DRAINING
// with the data path, so the owner's call ended UNKNOWN although the server
// was up, the record was in its store and the handler finished moments
// later (DESIGN.md §3.12: the control path stays open; §3.5: resolve
// before repeat).
func TestDrainingKeepsTheControlPathOpen(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	store := memoryStore(t)
	started, finish := make(chan struct{}), make(chan struct{})
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		close(started)
		<-finish
		return &testingv1.ApplyResponse{Total: 7}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(store))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(3*time.Second), interceptor.WithoutRetryBudget(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, PerTryTimeout: 300 * time.Millisecond}))...))
	done := make(chan error, 1)
	go func() {
		_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
		done <- err
	}()
	<-started
	require.NoError(t, ctrl.Close()) // the server drains: no new work
	go func() { time.Sleep(600 * time.Millisecond); close(finish) }()
	err = <-done
	o := status.OutcomeOf(err)
	t.Logf("owner: %v (%v)", o.Kind, err)
	require.NoError(t, err, "the owner resolved its try from the draining server's record")
}

// heldSlotServer starts a trusting server whose class "work" (the default:
// one slot, four places, 100 ms expected service) has its only slot held by
// an Apply until the test ends, and returns a plain client of it: the
// test's next call waits in the queue.
func heldSlotServer(t *testing.T) testingv1.TestServiceClient {
	t.Helper()
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4,
		ExpectedServiceTime: 100 * time.Millisecond}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	h := newSlotHolder()
	svc := &testsvc.Service{ApplyFunc: h.apply}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	h.holdApply(context.Background(), client)
	t.Cleanup(func() { _ = h.free() })
	return client
}

// TestNotFinalDequeueDropSuggestsADelay: a trusted try whose own
// grpc-timeout (300 ms) ends well before its attempt's deadline (3 s) waits
// behind the only slot and is dropped once it can no longer finish; the
// interceptor makes that refusal not final (a later try may fit). A review
// found that it carried no retry-after, inviting the caller to repeat at
// once into the same full class (DESIGN.md §3.6: refusals carry a
// retry-after that reflects the queue).
func TestNotFinalDequeueDropSuggestsADelay(t *testing.T) {
	client := heldSlotServer(t)

	id, _ := uuid.NewV7()
	d := time.Now().Add(3 * time.Second).UnixMilli()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, d))
	_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "b"})
	o := status.OutcomeOf(err)
	ra, ok := status.RetryAfter(err)
	t.Logf("%v final=%v retry-after %v (%v)", o.Reason, o.Final(), ra, ok)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason)
	require.False(t, o.Final())
	require.True(t, ok && ra > 0, "a repeatable refusal from a full class suggests when to repeat")
}

// TestAStreamHoldingTheSlotCountsByItsAge: a bidi stream has held the
// class's only slot for 300 ms and will hold it longer. A review found that
// a unary call of the same class was refused and told to come back in about
// the unary service time (or the 10 ms floor), a retry-after that did not
// reflect what occupies the class (DESIGN.md §3.6), and that a call with a
// deadline far shorter than the stream's age was queued, to be dropped when
// its deadline came, rather than refused DEADLINE_UNREACHABLE on arrival: a
// stream's permit counted as a unary job's. A running stream is now expected
// to live as long again as it has.
func TestAStreamHoldingTheSlotCountsByItsAge(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 1,
		ExpectedServiceTime: 2 * time.Millisecond}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	release := make(chan struct{})
	svc := &testsvc.Service{
		GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return &testingv1.GetResponse{}, nil
		},
		ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
			if err := st.Send(&testingv1.ChatResponse{}); err != nil {
				return err
			}
			select {
			case <-release:
			case <-st.Context().Done():
			}
			return nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // the stream has held the slot a while

	// A call with 200 ms to live: the one slot has been busy for longer.
	start := time.Now()
	qctx, qcancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	_, qerr := client.Get(qctx, &testingv1.GetRequest{})
	qcancel()
	waited := time.Since(start)

	// Another call waits in the queue's one place; the next is refused.
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Queued == 0 }, time.Second, time.Millisecond)
	filler := make(chan error, 1)
	go func() {
		fctx, fcancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer fcancel()
		_, err := client.Get(fctx, &testingv1.GetRequest{})
		filler <- err
	}()
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Queued == 1 }, time.Second, time.Millisecond)
	rctx, rcancel := context.WithTimeout(t.Context(), 2*time.Second)
	_, err = client.Get(rctx, &testingv1.GetRequest{})
	rcancel()
	close(release)
	<-filler
	o := status.OutcomeOf(err)
	ra, _ := status.RetryAfter(err)
	t.Logf("queued call: %v after %v; refusal: %v retry-after %v", status.OutcomeOf(qerr).Reason, waited, o.Reason, ra)
	require.Equal(t, status.ReasonDeadlineUnreachable, status.OutcomeOf(qerr).Reason, "refused on arrival: %v", qerr)
	require.Less(t, waited, 150*time.Millisecond, "refused on arrival, not queued until its deadline")
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Greater(t, ra, 100*time.Millisecond, "the retry-after reflects a slot held for 300 ms, not the unary service time")
}

// TestFinalDequeueDropTellsGrpcNotToRetry: a caller that does not speak
// tollgate (the server is its origin) waits behind the only slot with
// 300 ms to live and is dropped, DEADLINE_EXPIRED, final: its deadline
// cannot be met by any repeat. Such a refusal's grpc-retry-pushback-ms is
// "-1" (status.Pushback), which stops grpc-go's own retry. A review found
// that a first version of the delay a repeatable drop needs
// (TestNotFinalDequeueDropSuggestsADelay) put one on every drop, and the
// trailer then invited the caller's retry policy to repeat the call.
func TestFinalDequeueDropTellsGrpcNotToRetry(t *testing.T) {
	client := heldSlotServer(t)

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	var tr metadata.MD
	_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "b"}, grpc.Trailer(&tr))
	o := status.OutcomeOf(err)
	t.Logf("%v final=%v pushback %q", o.Reason, o.Final(), tr.Get(status.PushbackKey))
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason)
	require.True(t, o.Final())
	require.Equal(t, []string{"-1"}, tr.Get(status.PushbackKey), "a final refusal tells grpc-go's retry to stop")
}

// A review found that the retry-after the server interceptor gives a try
// that admission dropped for the try's own deadline while its attempt's has
// not passed (tryDeadlineOnly) had no upper bound: it was the class's
// predicted wait, jittered, read from a Stats snapshot, while admission
// bounds its own refusals' by WithMaxRetryAfter. Here one slot runs work
// expected to take 10 minutes and four requests wait (a predicted wait of
// 50 minutes): the suggestion must stay below admission's bound, as
// admission's own refusal's would, and still be jittered.
func TestTryDeadlineRetryAfterIsBoundedLikeAdmissions(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "w", Slots: 1, QueueItems: 4,
		ExpectedServiceTime: 10 * time.Minute, MaxServiceTime: time.Hour}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	r := admission.Request{Method: "/s.S/M", Size: -1}
	p, err := ctrl.Admit(t.Context(), r)
	require.NoError(t, err)
	defer p.Abandon()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 4)
	for range 4 {
		go func() { _, err := ctrl.Admit(ctx, r); done <- err }()
	}
	defer func() {
		cancel()
		for range 4 {
			<-done
		}
	}()
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("w"); return s.Queued == 4 }, 10*time.Second, time.Millisecond)

	seen := map[time.Duration]bool{}
	for range 20 {
		d := interceptor.QueueDelay(ctrl, "w")
		require.Less(t, d, admission.DefaultMaxRetryAfter, "the class predicts a 50-minute wait; admission's own refusal would suggest less than its bound")
		require.GreaterOrEqual(t, d, admission.DefaultMaxRetryAfter/3)
		seen[d] = true
	}
	require.Greater(t, len(seen), 10, "jittered, never a constant")
}

package interceptor_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// gatedStore is a memory store that counts the Begin calls of late tries
// (BeginRequest.Deadline in the past) and holds a Get of the call "hold"
// until release is closed, after closing held: an AttemptService query
// that keeps its control slot for as long as the test needs.
type gatedStore struct {
	*idempotency.MemoryStore
	lateBegins    atomic.Int64
	held, release chan struct{}
}

func newGatedStore(t *testing.T) *gatedStore {
	return &gatedStore{MemoryStore: memoryStore(t), held: make(chan struct{}), release: make(chan struct{})}
}

func (s *gatedStore) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	if req.Deadline.Before(time.Now()) {
		s.lateBegins.Add(1)
	}
	return s.MemoryStore.Begin(ctx, req)
}

func (s *gatedStore) Get(ctx context.Context, key idempotency.Key) (*tollgatev1.AttemptRecord, error) {
	if key.Call == "hold" {
		close(s.held)
		<-s.release
	}
	return s.MemoryStore.Get(ctx, key)
}

// holdQuery sends, with ctx, an AttemptService query of attempt id's call
// "hold" through attempts and returns once the store holds it (its
// admission slot taken); free lets it finish and gives its error.
func (s *gatedStore) holdQuery(t *testing.T, ctx context.Context, attempts tollgatev1.AttemptServiceClient, id string) (free func() error) {
	t.Helper()
	queried := make(chan error, 1)
	go func() {
		_, err := attempts.GetAttempt(ctx, &tollgatev1.GetAttemptRequest{
			AttemptId: id, Call: "hold", Method: testingv1.TestService_Apply_FullMethodName})
		queried <- err
	}()
	<-s.held
	return func() error {
		close(s.release)
		return <-queried
	}
}

// lateTryServer serves a ledger's Apply with records in st and admission
// by ctrl (its tap included), and the AttemptService; it returns the data
// and AttemptService clients.
func lateTryServer(t *testing.T, st idempotency.Store, ctrl *admission.Controller, svc *testsvc.Service) (testingv1.TestServiceClient, tollgatev1.AttemptServiceClient) {
	t.Helper()
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(st))
	}, serverOpts(interceptor.WithAttemptStore(st), interceptor.WithAdmission(ctrl))...)
	conn := end.DialT(t)
	return testingv1.NewTestServiceClient(conn), tollgatev1.NewAttemptServiceClient(conn)
}

// tryHeader returns ctx carrying a trusted peer's tollgate header for try of
// call under attempt id and tenant, with the attempt's deadline d.
func tryHeader(ctx context.Context, id, tenant, call string, try int, d time.Time) context.Context {
	v := "a=" + id + ";c=" + call + ";t=" + strconv.Itoa(try) + ";d=" + strconv.FormatInt(d.UnixMilli(), 10)
	if tenant != "" {
		v += ";n=" + tenant
	}
	return metadata.AppendToOutgoingContext(ctx, "tollgate", v)
}

// lateTryController is an admission controller with opts, closed when the
// test ends.
func lateTryController(t *testing.T, opts ...admission.Option) *admission.Controller {
	t.Helper()
	ctrl, err := admission.New(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	return ctrl
}

// lateTryCall starts an attempt and sends try 1 of its call "late" (req)
// through client, before the attempt's deadline, under each of tenants in
// turn (none named: once, under no tenant). It returns the attempt's ID and
// the last try 1's response.
func lateTryCall(t *testing.T, client testingv1.TestServiceClient, req *testingv1.ApplyRequest, tenants ...string) (string, *testingv1.ApplyResponse) {
	t.Helper()
	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	if len(tenants) == 0 {
		tenants = []string{""}
	}
	later := time.Now().Add(5 * time.Second)
	var resp *testingv1.ApplyResponse
	for _, tenant := range tenants {
		resp, err = client.Apply(tryHeader(t.Context(), a.ID, tenant, "late", 1, later), req)
		require.NoError(t, err)
	}
	return a.ID, resp
}

// A review found that a trusted peer's try arriving after its attempt's
// deadline plus the skew, for a recorded method, took no admission slot at
// all (server.admit returned at once for it): each such try is a store
// lookup, so a flood of them (a replaying or misbehaving trusted peer)
// loaded the store unbounded, past every class and tenant limit. It is a
// record query, control-class work like an AttemptService query, and is now
// admitted in the control class: with the class's one slot held by a query,
// a late try is refused CONCURRENCY_FULL (class control) without reaching
// the store; once the slot is free it is answered from its record, and
// the control class counts its admission.
func TestLateTryIsAdmittedInTheControlClass(t *testing.T) {
	ctrl := lateTryController(t,
		admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4},
			admission.Class{Name: admission.ControlClass, Slots: 1}),
		admission.WithDefaultClass("work"))
	st := newGatedStore(t)
	ledger := newLedger(nil)
	client, attempts := lateTryServer(t, st, ctrl, &ledger.Service)

	req := &testingv1.ApplyRequest{Key: "acct", Amount: 4}
	id, first := lateTryCall(t, client, req)

	// An AttemptService query holds the control class's only slot.
	free := st.holdQuery(t, t.Context(), attempts, id)
	past := time.Now().Add(-time.Second) // the attempt's deadline has passed (the test server's skew is 0)
	_, err := client.Apply(tryHeader(t.Context(), id, "", "late", 2, past), req)
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonConcurrencyFull, o.Reason,
		"the late try is a record query: with the control class full it is refused as one (%v)", err)
	require.Equal(t, admission.ControlClass, o.Detail.GetWorkloadClass())
	require.Equal(t, id, o.Detail.GetAttemptId(), "the refusal names the try it answers")
	require.Zero(t, st.lateBegins.Load(), "a refused late try does not reach the store")

	require.NoError(t, free())
	before, _ := ctrl.Stats().Class(admission.ControlClass)
	again, err := client.Apply(tryHeader(t.Context(), id, "", "late", 2, past), req)
	require.NoError(t, err, "with the slot free, the late try is answered from its record")
	require.Equal(t, first.GetTotal(), again.GetTotal())
	require.Equal(t, int64(1), ledger.effects.Load(), "only the first try ran")
	require.Equal(t, int64(1), st.lateBegins.Load())
	after, _ := ctrl.Stats().Class(admission.ControlClass)
	require.Equal(t, before.Admitted+1, after.Admitted, "the late try took a control slot")
	require.Zero(t, after.UsedSlots, "and gave it back")
	work, _ := ctrl.Stats().Class("work")
	require.Equal(t, uint64(1), work.Admitted, "only the first try took a data slot")
}

// The control class's tenant limits hold for late tries: they are admitted
// under the tenant their header names. With tenant a's one running query in
// a class that lets a tenant run one, tenant a's late try is refused
// TENANT_LIMIT, while tenant b's is answered from its record (A review
// found late tries were admitted nowhere, so no tenant limit held them).
func TestLateTryKeepsTheControlClassTenantLimits(t *testing.T) {
	ctrl := lateTryController(t,
		admission.WithClasses(admission.Class{Name: "work", Slots: 4},
			admission.Class{Name: admission.ControlClass, Slots: 4, TenantRunning: 1}),
		admission.WithDefaultClass("work"))
	st := newGatedStore(t)
	ledger := newLedger(nil)
	client, attempts := lateTryServer(t, st, ctrl, &ledger.Service)

	req := &testingv1.ApplyRequest{Key: "acct", Amount: 1}
	id, _ := lateTryCall(t, client, req, "a", "b")

	free := st.holdQuery(t, metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+id+";n=a"), attempts, id)
	defer func() { require.NoError(t, free()) }()

	past := time.Now().Add(-time.Second)
	_, err := client.Apply(tryHeader(t.Context(), id, "a", "late", 2, past), req)
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonTenantLimit, o.Reason, "tenant a runs its one query: %v", err)
	require.Equal(t, admission.ControlClass, o.Detail.GetWorkloadClass())
	_, err = client.Apply(tryHeader(t.Context(), id, "b", "late", 2, past), req)
	require.NoError(t, err, "tenant b's late try is answered from its record")
	require.Equal(t, int64(2), ledger.effects.Load(), "each tenant's first try ran, no late one")
	require.Equal(t, int64(1), st.lateBegins.Load(), "only tenant b's late try reached the store")
}

// Through the admission tap: a late try is not refused for its data class,
// whose one slot is held (the tap's flag says full), and is admitted in the
// control class instead (A review found it was admitted in no class).
func TestLateTryPastAFullDataClassTakesAControlSlot(t *testing.T) {
	ctrl := lateTryController(t, admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	h := newSlotHolder()
	ledger := newLedger(func(ctx context.Context, r *testingv1.ApplyRequest) { _, _ = h.apply(ctx, r) })
	client, _ := lateTryServer(t, memoryStore(t), ctrl, &ledger.Service)

	req := &testingv1.ApplyRequest{Key: "acct", Amount: 2}
	id, first := lateTryCall(t, client, req)

	h.holdApply(t.Context(), client)
	defer func() { require.NoError(t, h.free()) }()

	before, _ := ctrl.Stats().Class(admission.ControlClass)
	again, err := client.Apply(tryHeader(t.Context(), id, "", "late", 2, time.Now().Add(-time.Second)), req)
	require.NoError(t, err, "the late try is answered from its record past the full data class")
	require.Equal(t, first.GetTotal(), again.GetTotal())
	after, _ := ctrl.Stats().Class(admission.ControlClass)
	require.Equal(t, before.Admitted+1, after.Admitted, "the late try's lookup took a control slot")
	work, _ := ctrl.Stats().Class("work")
	require.Zero(t, work.Refused["CONCURRENCY_FULL"], "neither the tap nor admission refused it for its data class")
}

// limited returns a client of a server for Apply whose calls an inner
// interceptor (a client-side limiter) refuses before they are sent, with a
// RetryInfo suggesting delay.
func limited(t *testing.T, delay time.Duration) testingv1.TestServiceClient {
	t.Helper()
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{}).Register, serverOpts()...)
	limiter := func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
		st, err := grpcstatus.New(codes.ResourceExhausted, "limiter: over quota").
			WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
		require.NoError(t, err)
		return st.Err()
	}
	return testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(1)),
		grpc.WithChainUnaryInterceptor(limiter))...))
}

// A review found that a NOT_SENT refusal adopted the delay of the RetryInfo
// an inner limiter returned as it was: one constant for every caller the
// limiter refused together (DESIGN.md §3.6: never a constant that
// synchronises clients), and without bound — a handler's client passes it
// up as its server's grpc-retry-pushback-ms. The adopted delay is now
// jittered upwards, uniformly in [d, 1½ d) (never before the limiter's
// quota returns, when the owner's own repeat would only be refused again),
// and stays below admission.DefaultMaxRetryAfter.
func TestNotSentAdoptedDelayIsJitteredAndBounded(t *testing.T) {
	t.Run("jittered", func(t *testing.T) {
		client := limited(t, 2*time.Second)
		seen := map[time.Duration]bool{}
		for range 20 {
			_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			o := status.OutcomeOf(err)
			require.Equal(t, status.ReasonNotSent, o.Reason, "%v", err)
			ra, ok := status.RetryAfter(err)
			require.True(t, ok)
			require.GreaterOrEqual(t, ra, 2*time.Second, "never before the limiter's quota returns")
			require.Less(t, ra, 3*time.Second)
			seen[ra] = true
		}
		require.Greater(t, len(seen), 1, "twenty refusals suggested one delay: %v", seen)
	})
	t.Run("bounded", func(t *testing.T) {
		client := limited(t, time.Hour)
		_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
		require.Equal(t, status.ReasonNotSent, status.OutcomeOf(err).Reason, "%v", err)
		ra, ok := status.RetryAfter(err)
		require.True(t, ok)
		require.Less(t, ra, admission.DefaultMaxRetryAfter, "the limiter's hour is bounded")
		require.GreaterOrEqual(t, ra, admission.DefaultMaxRetryAfter*2/3)
	})
}

// Without a control class (admission.WithoutControlClass, which classifies
// AttemptService queries like other methods) a late try is classified like
// any request, by its method: here into the class whose one slot is held,
// where it is refused as a query would be, not let through unadmitted.
func TestLateTryWithoutAControlClassIsClassifiedByItsMethod(t *testing.T) {
	ctrl := lateTryController(t, admission.WithClasses(admission.Class{Name: "work", Slots: 1}),
		admission.WithDefaultClass("work"), admission.WithoutControlClass())
	h := newSlotHolder()
	ledger := newLedger(func(ctx context.Context, r *testingv1.ApplyRequest) { _, _ = h.apply(ctx, r) })
	st := newGatedStore(t)
	client, _ := lateTryServer(t, st, ctrl, &ledger.Service)

	req := &testingv1.ApplyRequest{Key: "acct", Amount: 2}
	id, _ := lateTryCall(t, client, req)

	h.holdApply(t.Context(), client)
	defer func() { require.NoError(t, h.free()) }()

	_, err := client.Apply(tryHeader(t.Context(), id, "", "late", 2, time.Now().Add(-time.Second)), req)
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonConcurrencyFull, o.Reason, "%v", err)
	require.Equal(t, "work", o.Detail.GetWorkloadClass())
	require.Zero(t, st.lateBegins.Load(), "the refused late try did not reach the store")
}

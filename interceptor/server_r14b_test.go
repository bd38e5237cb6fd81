package interceptor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// contextEnded counts every try whose context ended by its deadline during
// the store's Begin in tollgate.deadline.misses{stage=begin}, which the
// README and doc.go define as tries that came in time. A late try (it came
// after its attempt's deadline, and only reads its call's record) does not
// qualify, and on a server with admission it is counted already: it was
// admitted as a lookup in the control class and its permit is released
// (Permit.Release, as a query's), where admission counts a permit released
// after its context's deadline as a miss of stage run. One request, whose
// deadline passed once, was counted twice: begin and run. A late try
// refused DEADLINE_EXPIRED is counted once, on arrival, as every late try
// refused for its lateness is, with or without admission, and a lookup its
// context ended is given back unrun (Permit.Abandon): it is no service time.
func TestR14bLateTryWhoseContextEndsDuringBeginIsCountedOnce(t *testing.T) {
	for _, withAdmission := range []bool{true, false} {
		t.Run(fmt.Sprintf("admission=%v", withAdmission), func(t *testing.T) {
			r14bLateTryCountedOnce(t, withAdmission)
		})
	}
}

func r14bLateTryCountedOnce(t *testing.T, withAdmission bool) {
	mp, reader := testMeter(t)
	extra := []interceptor.ServerOption{interceptor.WithServerMeterProvider(mp)}
	if withAdmission {
		ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
			admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ctrl.Close() })
		extra = append(extra, interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap())
	}
	store := &r14EndBeforeBegin{MemoryStore: memoryStore(t)}
	served := make(chan error, 1)
	// As a user's timeout interceptor, chained outside tollgate's.
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		resp, err := h(ctx, req)
		served <- err
		return resp, err
	})
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	opts := append([]grpc.ServerOption{outer}, serverOpts(append(extra, interceptor.WithAttemptStore(store))...)...)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) }, opts...)
	client := testingv1.NewTestServiceClient(end.DialT(t))

	store.arm()
	id, _ := uuid.NewV7()
	// Its attempt's deadline has passed: the try only reads its record.
	_, err := client.Apply(r14Header(t.Context(), id, 2, time.Now().Add(-time.Second)), &testingv1.ApplyRequest{Key: "k"})
	require.Error(t, err)
	o := status.OutcomeOf(<-served)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason)
	require.Zero(t, svc.Calls("Apply"))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	misses := r14Misses(t, rm)
	total := int64(0)
	for _, n := range misses {
		total += n
	}
	require.Equal(t, int64(1), total, "one late request, one miss: %v", misses)
	require.Equal(t, int64(1), misses["arrival"], "a late try refused for its lateness: %v", misses)
}

// r14bSlowTombstone is a store whose clock lags the server's (it starts a
// try the server knows is late, see r14LaggingStore) and whose Finish
// takes until the try's caller's deadline has passed.
type r14bSlowTombstone struct {
	*idempotency.MemoryStore
	callerGone <-chan struct{}
}

func (s *r14bSlowTombstone) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	req.Deadline = time.Now().Add(10 * time.Second)
	return s.MemoryStore.Begin(ctx, req)
}

func (s *r14bSlowTombstone) Finish(ctx context.Context, req idempotency.FinishRequest) error {
	<-s.callerGone
	return s.MemoryStore.Finish(ctx, req)
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// 84a19fa writes the tombstone of a late try a lagging store started on a
// context detached from its caller's, bounded by streamFinishTimeout, so
// the write may now outlive the caller's deadline. The try is refused
// DEADLINE_EXPIRED and counted on arrival (lateRefusal); its lookup's
// permit was then released (Permit.Release), and admission counted a
// permit released after its context's deadline once more, as a run miss:
// two counts for one late request. A lookup whose context ended is given
// back unrun (Permit.Abandon), and counted once.
func TestR14bLateStartedTryWhoseTombstoneOutlivesItsCallerIsCountedOnce(t *testing.T) {
	mp, reader := testMeter(t)
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
		admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	gone := make(chan struct{})
	store := &r14bSlowTombstone{MemoryStore: memoryStore(t), callerGone: gone}
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		stop := context.AfterFunc(ctx, func() { close(gone) })
		defer stop()
		return h(ctx, req)
	})
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	opts := append([]grpc.ServerOption{outer}, serverOpts(interceptor.WithAttemptStore(store),
		interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap(), interceptor.WithServerMeterProvider(mp))...)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) }, opts...)
	client := testingv1.NewTestServiceClient(end.DialT(t))

	id, _ := uuid.NewV7()
	_, err = client.Apply(r14Header(t.Context(), id, 1, time.Now().Add(-time.Second)), &testingv1.ApplyRequest{Key: "k"})
	require.Error(t, err)
	require.Zero(t, svc.Calls("Apply"), "the late try did not run")
	rec, err := store.Get(t.Context(), idempotency.Key{AttemptID: id.String(), Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, map[string]int64{"arrival": 1}, r14Misses(t, rm))
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// 25e6106 replays a FAILED record through status.Bounded, which kept the
// record's details in their order while they fit 3 KiB. A record whose
// tollgate OutcomeDetail comes after a large detail (written by another
// build, or by a store's own writer, which is what the bound on replay is
// for) lost that detail while the large one was kept, so later tries read
// a definite FAILED by the code where the record's detail said otherwise
// (here COMMITTED: the effect happened). Bounded now keeps the detail an
// error is read by first.
func TestR14bReplayedRecordKeepsItsTollgateDetail(t *testing.T) {
	store := memoryStore(t)
	svc, client := replayServer(t, store)

	id, _ := uuid.NewV7()
	committed := grpcstatus.Convert(status.Committed(status.WithAttempt(id.String(), "0", 1))).Proto()
	var filler *anypb.Any
	for k := 3 << 10; filler == nil; k-- { // fills the bound but for 8 bytes
		a, err := anypb.New(&errdetails.DebugInfo{Detail: strings.Repeat("d", k)})
		require.NoError(t, err)
		if r14DetailsWireSize([]*anypb.Any{a}) <= 3<<10-8 {
			filler = a
		}
	}
	d := time.Now().Add(5 * time.Second)
	req := &testingv1.ApplyRequest{Key: "k"}
	writeFinishedTry1(t, store, id, d, req, idempotency.FinishRequest{
		State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, Code: codes.FailedPrecondition, Message: strings.Repeat("m", 2<<10),
		Details: append([]*anypb.Any{filler}, committed.GetDetails()...)})

	_, err := client.Apply(r14Header(t.Context(), id, 2, d), req)
	require.Equal(t, codes.FailedPrecondition, grpcstatus.Code(err))
	require.Equal(t, status.KindCommitted, status.OutcomeOf(err).Kind, "the record's detail is read: %.300v", err)
	require.Zero(t, svc.Calls("Apply"))
}

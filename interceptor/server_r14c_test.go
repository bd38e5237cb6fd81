package interceptor_test

import (
	"context"
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// r14cAnswersLate is a store whose Begin answers only once its caller's
// context has ended: it reads the record while the context lives, and its
// answer arrives as the caller's deadline passes (a store that does not
// give up on its context, or a reply that crossed the deadline).
type r14cAnswersLate struct {
	*idempotency.MemoryStore
}

func (s *r14cAnswersLate) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	res, err := s.MemoryStore.Begin(ctx, req)
	<-ctx.Done()
	return res, err
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// 5cfc16b gives a late try's lookup permit back unrun (Permit.Abandon)
// whenever its context has ended once the store answered, on the ground
// that its miss is counted on arrival (contextEnded, lateRefusal). It is
// only when the store failed or refused the try for its lateness. A late
// try its record answers (here a FAILED record replayed) is counted on no
// arrival: its lookup ran past its deadline, which admission counted as a
// run miss (and a false accept, and a service time) while the permit was
// released. Abandoned, the request is counted in no stage at all, and
// admission does not learn that its control class's lookups run past their
// deadlines. Only a lookup whose miss the interceptor counted is abandoned.
func TestR14cLateTryAnsweredByItsRecordAfterItsContextEndedIsCountedOnce(t *testing.T) {
	mp, reader := testMeter(t)
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
		admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	mem := memoryStore(t)
	store := &r14cAnswersLate{MemoryStore: mem}
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		return h(ctx, req)
	})
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	opts := append([]grpc.ServerOption{outer}, serverOpts(interceptor.WithAttemptStore(store),
		interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap(), interceptor.WithServerMeterProvider(mp))...)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) }, opts...)
	client := testingv1.NewTestServiceClient(end.DialT(t))

	// Try 1 ran and failed definitely; its record says so.
	id, _ := uuid.NewV7()
	req := &testingv1.ApplyRequest{Key: "k"}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	require.NoError(t, err)
	method := testingv1.TestService_Apply_FullMethodName
	key := idempotency.Key{AttemptID: id.String(), Call: "0", Method: method}
	fp := idempotency.Fingerprint(method, b)
	res, err := mem.Begin(t.Context(), idempotency.BeginRequest{Key: key, Try: 1, Fingerprint: fp, Deadline: time.Now().Add(5 * time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, mem.Finish(t.Context(), idempotency.FinishRequest{Key: key, Try: 1, Fingerprint: fp,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, Code: codes.FailedPrecondition, Message: "no"}))

	// Try 2 comes after the attempt's deadline: its record answers it, once
	// its context has ended.
	_, err = client.Apply(r14Header(t.Context(), id, 2, time.Now().Add(-time.Second)), req)
	require.Equal(t, codes.FailedPrecondition, grpcstatus.Code(err), "the record answers: %v", err)
	require.Zero(t, svc.Calls("Apply"))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, map[string]int64{"run": 1}, r14Misses(t, rm),
		"a lookup that ran past its deadline, no miss on arrival: admission's run miss")
	require.Equal(t, uint64(1), r14cFalseAccepts(ctrl), "admission learns its lookup ran late")
}

func r14cFalseAccepts(ctrl *admission.Controller) uint64 {
	var n uint64
	for _, c := range ctrl.Stats().Classes {
		n += c.FalseAccepts
	}
	return n
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// A handler's NOT_ADMITTED wrapped with status.WithoutEffect is answered as
// a refusal the server rebuilds, which keeps "the class that refused it"
// from the handler's tollgate detail (Fields.Class), whatever its length:
// status bounds messages and carried details, but not a detail's strings.
// A handler (or the service below it whose refusal it passes on) naming a
// 64 KiB class sent a 64 KiB detail past every bound, and a caller with an
// 8 KiB header list limit lost the refusal to a transport INTERNAL. A class
// name longer than 256 bytes is dropped.
func TestR14cHandlerRefusalWithAHugeClassReachesItsCaller(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonQueueFull, status.WithClass(strings.Repeat("c", 64<<10))))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) }, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithMaxHeaderListSize(8<<10)))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "the refusal arrives: %.300v", err)
	require.Equal(t, status.ReasonQueueFull, o.Reason)
	require.Empty(t, o.Detail.GetWorkloadClass())
}

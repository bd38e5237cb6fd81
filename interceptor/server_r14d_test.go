package interceptor_test

import (
	"context"
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
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// r14dTimedStream is a server stream whose context is its own.
type r14dTimedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *r14dTimedStream) Context() context.Context { return s.ctx }

// TestR14dLateStreamAnsweredByItsRecordAfterItsContextEndedIsCountedOnce is
// TestR14cLateTryAnsweredByItsRecordAfterItsContextEndedIsCountedOnce for a
// stream, whose late try's lookup permit the stream interceptor gives back
// by the same rule (a review of 5290526 checked that both paths do; this
// test keeps the stream's): a late stream try its record answers once its
// context has ended is counted once, as admission's run miss, and admission
// learns that its lookup ran late.
func TestR14dLateStreamAnsweredByItsRecordAfterItsContextEndedIsCountedOnce(t *testing.T) {
	mp, reader := testMeter(t)
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
		admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	mem := memoryStore(t)
	store := &r14cAnswersLate{MemoryStore: mem}
	outer := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, cancel := context.WithTimeout(ss.Context(), 20*time.Millisecond)
		defer cancel()
		return h(srv, &r14dTimedStream{ServerStream: ss, ctx: ctx})
	})
	svc := &testsvc.Service{}
	opts := append([]grpc.ServerOption{outer}, serverOpts(interceptor.WithAttemptStore(store),
		interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap(), interceptor.WithServerMeterProvider(mp))...)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) }, opts...)
	client := testingv1.NewTestServiceClient(end.DialT(t))

	// Try 1 ran and failed definitely; its record says so.
	id, _ := uuid.NewV7()
	method := testingv1.TestService_Upload_FullMethodName
	key := idempotency.Key{AttemptID: id.String(), Call: "0", Method: method}
	fp := idempotency.Fingerprint(method, nil) // a client stream's fingerprint weighs no request
	res, err := mem.Begin(t.Context(), idempotency.BeginRequest{Key: key, Try: 1, Fingerprint: fp, Deadline: time.Now().Add(5 * time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, mem.Finish(t.Context(), idempotency.FinishRequest{Key: key, Try: 1, Fingerprint: fp,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, Code: codes.FailedPrecondition, Message: "no"}))

	// Try 2 comes after the attempt's deadline: its record answers it, once
	// its context has ended.
	stream, err := client.Upload(r14Header(t.Context(), id, 2, time.Now().Add(-time.Second)))
	require.NoError(t, err)
	_, err = stream.CloseAndRecv()
	require.Equal(t, codes.FailedPrecondition, grpcstatus.Code(err), "the record answers: %v", err)
	require.Zero(t, svc.Calls("Upload"))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, map[string]int64{"run": 1}, r14Misses(t, rm),
		"a lookup that ran past its deadline, no miss on arrival: admission's run miss")
	require.Equal(t, uint64(1), r14cFalseAccepts(ctrl), "admission learns its lookup ran late")
}

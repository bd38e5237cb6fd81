package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
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

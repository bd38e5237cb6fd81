package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

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
	hold, rel := make(chan struct{}), make(chan struct{})
	var bRuns atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if r.GetKey() == "hold" {
			close(hold)
			<-rel
			return &testingv1.ApplyResponse{}, nil
		}
		bRuns.Add(1)
		return &testingv1.ApplyResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	raw := testingv1.NewTestServiceClient(end.DialT(t))
	aDone := make(chan error, 1)
	go func() {
		_, err := raw.Apply(context.Background(), &testingv1.ApplyRequest{Key: "hold"})
		aDone <- err
	}()
	<-hold
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
	close(rel)
	require.NoError(t, <-aDone)
	err = <-bErr
	o := status.OutcomeOf(err)
	t.Logf("B after %v: %v (final=%v)", time.Since(start), err, o.Final())
	require.NoError(t, err, "the owner gave up at %v of a 1.5s attempt on a final %v; the slot was free", time.Since(start).Round(time.Millisecond), o.Reason)
}

// A waiter dropped for a deadline that is its attempt's own (a plain client
// whose grpc-timeout the server takes for the attempt's deadline) cannot fit
// any later try either: its refusal stays final (found by review).
func TestDequeueDropOfTheAttemptsDeadlineStaysFinal(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	hold, rel := make(chan struct{}), make(chan struct{})
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if r.GetKey() == "hold" {
			close(hold)
			<-rel
		}
		return &testingv1.ApplyResponse{}, nil
	}}
	// A skew (the default's order): the attempt's deadline plus the skew is
	// later than the grpc-timeout the server took for the attempt's deadline.
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(200*time.Millisecond))...)
	raw := testingv1.NewTestServiceClient(end.DialT(t))
	aDone := make(chan error, 1)
	go func() {
		_, err := raw.Apply(context.Background(), &testingv1.ApplyRequest{Key: "hold"})
		aDone <- err
	}()
	<-hold
	defer func() { close(rel); require.NoError(t, <-aDone) }()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err = raw.Apply(ctx, &testingv1.ApplyRequest{Key: "b"}) // queued; gives up at 400 ms
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
	require.True(t, o.Final(), "the attempt's own deadline cannot be met by any try: %v", err)
}

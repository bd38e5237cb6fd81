package interceptor_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	grpcstatus "google.golang.org/grpc/status"
)

// queueScene: class work (1 slot, 1 queue place, 100ms expected service);
// A holds the slot; B (600ms timeout) is queued: at arrival it could finish
// (predicted wait ≈100ms + 100ms service < 600ms). A then overruns, so from
// 500ms on B can no longer finish in time.
func queueScene(t *testing.T, tap bool) (client testingv1.TestServiceClient, ctrl *admission.Controller, bErr chan error, release func()) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 1, ExpectedServiceTime: 100 * time.Millisecond}))
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
	opts := []interceptor.ServerOption{interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(0)}
	if !tap {
		opts = append(opts, interceptor.WithoutAdmissionTap())
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(opts...)...)
	client = testingv1.NewTestServiceClient(end.DialT(t))
	aDone := make(chan error, 1)
	go func() {
		_, err := client.Apply(context.Background(), &testingv1.ApplyRequest{Key: "hold"})
		aDone <- err
	}()
	<-hold
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
			close(rel)
			require.NoError(t, <-aDone)
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
// newcomer (TestRegressionExpiredWaiterHoldsQueue), the tap refused
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
	hold, rel := make(chan struct{}), make(chan struct{})
	var bRuns atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if r.GetKey() == "hold" {
			close(hold)
			<-rel
		} else {
			bRuns.Add(1)
		}
		return &testingv1.ApplyResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap())...)
	raw := testingv1.NewTestServiceClient(end.DialT(t))
	aDone := make(chan error, 1)
	go func() {
		_, err := raw.Apply(context.Background(), &testingv1.ApplyRequest{Key: "hold"})
		aDone <- err
	}()
	<-hold
	defer func() { close(rel); require.NoError(t, <-aDone) }()
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(2*time.Second), interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "b"})
	t.Logf("B: %v outcome %+v", err, status.OutcomeOf(err))
	require.Zero(t, bRuns.Load())
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "a try that never ran, kept queued until the client gave up, ends %v", status.OutcomeOf(err).Kind)
}

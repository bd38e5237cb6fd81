package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

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

	hold, release := make(chan struct{}), make(chan struct{})
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if r.GetKey() == "hold" {
			close(hold)
			<-release
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	done := make(chan error, 1)
	go func() {
		_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "hold"})
		done <- err
	}()
	<-hold

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
	close(release)
	require.NoError(t, <-done)
	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err, "admission recovers once the slot is free")
}

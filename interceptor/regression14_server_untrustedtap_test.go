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
)

// A tollgate client the server does not trust: its header is ignored, and
// the server interceptor tells it so on every answer (tollgate-spent: 0) so
// that its lenient ledger does not hold the grant it lent "with no record to
// reconcile them" (server.begin). A refusal by the admission tap carries no
// trailer and, for an untrusted peer, no attempt/call/try either, so the
// client cannot tell the refusal answers its very try: it holds the grant,
// and nothing ever reconciles it. Each refused call leaks its grant from the
// attempt's allowance.
func TestRegression14UntrustedTapRefusalLeaksTheGrant(t *testing.T) {
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
	// No WithTrustedPeer: no peer is trusted (the default).
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		interceptor.ServerOptions(interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(0))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	done := make(chan error, 1)
	go func() {
		_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "hold"})
		done <- err
	}()
	<-hold
	defer func() { close(release); require.NoError(t, <-done) }()

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

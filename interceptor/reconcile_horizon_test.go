package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// TestUnknownForLackOfHorizonKeepsTheGrantHeld: DESIGN.md
// §3.3 — a held grant moves to spent/free only from a record finished as
// SUCCEEDED, FAILED, FENCED or UNKNOWN, "never IN_PROGRESS, ABANDONED or an
// UNKNOWN answered for lack of a horizon". Here the callee's store loses its
// records (Reset: a restart) while the try runs, so the owner's FenceAttempt
// is answered UNKNOWN for lack of a horizon: the try may have spent its whole
// grant below, so the grant must stay held. No other test failed when
// owner.reconcile reconciled unfinished records.
func TestUnknownForLackOfHorizonKeepsTheGrantHeld(t *testing.T) {
	store := memoryStore(t)
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		store.Reset() // the records are lost and the horizon moves past this attempt
		time.Sleep(150 * time.Millisecond)
		return nil, grpcstatus.Error(codes.Internal, "boom after a possible effect")
	}}
	end := recordedServer(t, svc, store)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 50 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}),
	)...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	l, _ := budget.FromContext(ctx)
	snap := l.Snapshot()
	require.Equal(t, int64(4), snap.Held, "an UNKNOWN answered for lack of a horizon keeps the grant held: %+v", snap)
	require.Zero(t, snap.Free, "%+v", snap)
}

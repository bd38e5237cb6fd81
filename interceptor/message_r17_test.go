package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// The refusal of an attempt its callee's new store cannot vouch for is
// NOT_ADMITTED, and its message reads so: it no longer quotes the callee's
// "tollgate: outcome unknown" inside a "not admitted" (a fresh-eyes review
// read the two as contradicting each other), and it stays short enough to
// read in a log line while still saying why and what to do.
func TestUnverifiableRefusalMessageReadsAsARefusal(t *testing.T) {
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
	require.NoError(t, err)
	minted := time.Now()
	for time.Now().UnixMilli() <= minted.UnixMilli() {
		time.Sleep(time.Millisecond) // the horizon lies after the attempt
	}
	store := mintedStores[0].build(t, idempotency.DefaultPolicy())
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	end := mintedServer(t, svc, store, interceptor.WithTrustedPeer(interceptor.TrustAll))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))

	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
	msg := err.Error()
	require.NotContains(t, msg, "outcome unknown")
	require.Contains(t, msg, "a new attempt can succeed")
	require.Contains(t, msg, "began retaining records")
	require.LessOrEqual(t, len(msg), 480, msg)
}

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
)

// TestUnverifiableFirstTryRefundsItsGrant: a server whose memory store
// was built after the attempt was minted (a restart) refuses try 1 with
// ATTEMPT_UNVERIFIABLE before running anything, and the owner ends the call
// NOT_ADMITTED, final — "no effect at this tier or below" (DESIGN.md §3.5,
// §3.6). The units it lent that try were therefore not spent, and must come
// back to the attempt's ledger. Found by examples/ledger.
func TestUnverifiableFirstTryRefundsItsGrant(t *testing.T) {
	ledger := newLedger(nil)
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	minted := time.Now()
	for time.Now().UnixMilli() <= minted.UnixMilli() {
		time.Sleep(time.Millisecond) // the store's horizon lies after the attempt
	}
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))

	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
	require.True(t, o.Final())
	require.Zero(t, ledger.effects.Load(), "nothing ran")

	led, _ := budget.FromContext(ctx)
	snap := led.Snapshot()
	require.Zero(t, snap.Held, "a call that ended NOT_ADMITTED (no effect) keeps nothing held")
	require.Equal(t, int64(4), snap.Free, "the grant of a try that never ran comes back")
}

// TestRelayedUnverifiableIsNotThisTrysRefusal: a server that does not speak
// tollgate, whose handler ran and passed up a deeper call's
// ATTEMPT_UNVERIFIABLE as it was (an UNKNOWN naming another attempt's call
// and try), did not refuse this try before running anything. The owner
// ended the call NOT_ADMITTED ("nothing ran") and freed the grant it lent
// whenever the refusal came on its first try; it now does so only for a
// refusal that names this attempt, call and try, and reads any other as
// the UNKNOWN it is.
func TestRelayedUnverifiableIsNotThisTrysRefusal(t *testing.T) {
	ran := make(chan struct{}, 1)
	plain := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		ran <- struct{}{}
		return nil, status.OutcomeUnknown(nil, status.WithAttempt("0190a5b2-7c3e-7def-8123-456789abcdef", "0.1.1", 1),
			status.WithReason(status.ReasonAttemptUnverifiable), status.Final())
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, plain.Register) // no tollgate on the server
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	require.Len(t, ran, 1, "the handler ran")
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "the handler ran: its answer is no proof that nothing did: %v", err)
	led, _ := budget.FromContext(ctx)
	require.Positive(t, led.Snapshot().Held, "the grant lent to a handler that ran is held, not freed")
}

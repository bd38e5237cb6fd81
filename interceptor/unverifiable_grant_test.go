package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
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

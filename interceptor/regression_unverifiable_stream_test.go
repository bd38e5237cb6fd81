package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// The stream twin of TestUnverifiableFirstTryRefundsItsGrant: the stream
// owner ends the call NOT_ADMITTED final but leaves try 1's grant held.
func TestRegressionUnverifiableFirstStreamTryRefundsItsGrant(t *testing.T) {
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	minted := time.Now()
	for time.Now().UnixMilli() <= minted.UnixMilli() {
		time.Sleep(time.Millisecond)
	}
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		return nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	_, err = st.Recv()
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
	require.True(t, o.Final())
	led, _ := budget.FromContext(ctx)
	snap := led.Snapshot()
	require.Zero(t, snap.Held, "a call that ended NOT_ADMITTED (no effect) keeps nothing held")
	require.Equal(t, int64(4), snap.Free)
}

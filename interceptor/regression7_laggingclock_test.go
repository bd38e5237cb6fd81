package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/metadata"
)

// TestRegression7RetryAfterLetsALaggingPeersNewAttemptPass: the young-horizon
// refusal's retry-after is documented as the time until a newly created
// attempt is verifiable ("a new attempt can succeed once the refusal's
// retry-after has passed"). The store measures a new attempt by the
// creating peer's clock (its UUIDv7 time), and DESIGN.md §3.1 lets a
// trusted peer's clock be up to the skew off the server's: a retry-after
// of horizon + skew − now by the server's clock let a peer whose clock lags
// by most of the skew, waiting exactly the retry-after, create an attempt
// that was refused again. The peer here waits the retry-after for real (the
// skew is small), then creates its attempt by its lagging clock.
func TestRegression7RetryAfterLetsALaggingPeersNewAttemptPass(t *testing.T) {
	const skew = 200 * time.Millisecond
	const lag = skew * 9 / 10 // within the skew DESIGN.md §3.1 allows
	p := idempotency.DefaultPolicy()
	p.Skew = skew
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	ledger := newLedger(nil)
	end := mintedServer(t, &ledger.Service, store, interceptor.WithClockSkew(skew), interceptor.WithTrustedPeer(interceptor.TrustAll))
	client := testingv1.NewTestServiceClient(end.DialT(t))
	send := func(id string) error {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
			"a="+id+";t=1;d="+itoa(time.Now().Add(10*time.Second).UnixMilli()))
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
		return err
	}

	// The peer's first attempt, created (by its lagging clock) just now.
	err = send(storetest.AttemptIDAt(time.Now().Add(-lag)))
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason, "%v", err)
	wait, ok := status.RetryAfter(err)
	require.True(t, ok, "a first try's young-horizon refusal carries a retry-after: %v", err)

	// It waits the retry-after and creates a new attempt by its clock.
	time.Sleep(wait)
	err = send(storetest.AttemptIDAt(time.Now().Add(-lag)))
	require.NoError(t, err, "a new attempt created after the retry-after (%v) by a peer %v behind, inside the skew %v",
		wait, lag, skew)
	require.Equal(t, int64(1), ledger.effects.Load())
}

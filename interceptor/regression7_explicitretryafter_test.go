package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/metadata"
)

// TestRegression7ExplicitKeyUnverifiableCarriesNoRetryAfter: the young-horizon
// refusal carries a retry-after only where a new attempt is known to be the
// right next step — the first try of a per-run key, which nobody else can
// have sent (records.go beforeHorizon: "A later try carries none: its earlier
// tries' outcome is unknown"; README: "with a retry-after ... on the first try
// of a numbered key"). Try 1 of an explicitly keyed call (WithCallKey) is
// exactly such a try whose earlier sending (by an earlier run of the handler)
// may have run: the server answers it UNKNOWN, final, and the owner returns
// that UNKNOWN as it is. It must not suggest a delay after which to go again,
// as it does not for try 2 — yet it does, since beforeHorizon looks only at
// the try number.
func TestRegression7ExplicitKeyUnverifiableCarriesNoRetryAfter(t *testing.T) {
	const skew = time.Minute // a new attempt is certainly inside the window
	p := idempotency.DefaultPolicy()
	p.Skew = skew
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	ledger := newLedger(nil)
	end := mintedServer(t, &ledger.Service, store, interceptor.WithClockSkew(skew), interceptor.WithTrustedPeer(interceptor.TrustAll))

	// Through the owner: an explicit key's first try.
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
	require.NoError(t, err)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	_, err = client.Apply(interceptor.WithCallKey(ctx, "reserve-stock"), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "an explicit key's first try may have been sent by an earlier run: %v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
	require.Zero(t, ledger.effects.Load())
	ra, ok := status.RetryAfter(err)
	require.False(t, ok, "an UNKNOWN outcome (earlier sending of the key may have run) suggests a delay of %v to go again", ra)

	// Raw, as a trusted peer sends it: the server itself attaches it.
	a, _ := interceptor.AttemptFromContext(ctx)
	raw := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
		"a="+a.ID+";c=0.reserve-stock;t=1;d="+itoa(a.Deadline.UnixMilli()))
	_, err = testingv1.NewTestServiceClient(end.DialT(t)).Apply(raw, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o = status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	ra, ok = status.RetryAfter(err)
	require.False(t, ok, "server: explicit key try 1 refused UNKNOWN with retry-after %v", ra)
}

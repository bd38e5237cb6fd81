package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
)

// A server that does not trust its caller (the default) re-addresses every
// refusal to the attempt it minted; the lenient client cannot match it to
// the try it sent and holds the grant; the origin's retry is then refused
// locally for lack of units, though nothing was spent.
var srvOpts = interceptor.ServerOptions(interceptor.WithClockSkew(0))

func TestRegressionUntrustedRefusalHoldsGrantForever(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if runs.Add(1) == 1 {
			return nil, shed()
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, srvOpts...) // default: untrusted
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	ledger, _ := budget.FromContext(ctx)
	t.Logf("runs=%d err=%v ledger=%+v", runs.Load(), err, ledger.Snapshot())
	require.NoError(t, err, "a SHED refusal without effect is retried")
	require.Zero(t, ledger.Snapshot().Held, "§2.3: a refusal that proves no effect refunds the grant; nothing can ever reconcile this hold")
}

package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// TestRegression13ZeroAllowanceOriginStillRepeatsALeafCall: the
// allowance counts RPCs sent *below* the origin; the origin's own tries are
// not charged (client.go prepare), and WithAllowance documents that "0 lets
// no call below the origin be sent" — not that the origin may not repeat.
// Yet prepare refuses every repeat of the origin with ALLOWANCE_EXHAUSTED,
// final, when the ledger's spent units reach its total, which with an
// allowance of 0 is always: MaxTries is silently 1 for a leaf call that
// needs no unit, and a transient refusal (SHED, without effect) is
// returned final.
func TestRegression13ZeroAllowanceOriginStillRepeatsALeafCall(t *testing.T) {
	var runs atomic.Int64
	svc := &testsvc.Service{
		GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			if runs.Add(1) == 1 {
				return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonShed))
			}
			return &testingv1.GetResponse{Value: "v"}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithAllowance(0),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}),
	)...)
	_, err := testingv1.NewTestServiceClient(conn).Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	require.NoError(t, err, "a leaf call that needs no unit is repeated under MaxTries 3; outcome %v", status.OutcomeOf(err).Reason)
	require.Equal(t, int64(2), runs.Load())
}

package interceptor_test

import (
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

// A callee's admission tap refuses before any handler runs and cannot set a
// trailer. Its refusal names the attempt, call and try it answers, so a
// lenient caller refunds the grant it lent; a strict caller, which trusts
// only the tollgate-spent trailer (a retrying proxy could have sent the try
// upstream before relaying some refusal), holds the grant as spent until a
// record reconciles it — and without an attempt store, none ever does.
func TestTapRefusalUnderStrictAndLenientAccounting(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "only", Slots: 1}), admission.WithDefaultClass("only"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	h := newSlotHolder()
	svc := &testsvc.Service{GetFunc: h.get}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	holder := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	h.holdGet(t.Context(), holder)
	defer func() { require.NoError(t, h.free()) }()

	for _, strict := range []bool{false, true} {
		opts := []interceptor.ClientOption{interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1})}
		if strict {
			opts = append(opts, interceptor.WithStrictAccounting())
		}
		client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(opts...)...))
		ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
		require.NoError(t, err)
		_, err = client.Get(ctx, &testingv1.GetRequest{})
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind, "strict=%v: %v", strict, err)
		require.Equal(t, status.ReasonConcurrencyFull, o.Reason, "strict=%v: the tap's refusal", strict)
		ledger, ok := budget.FromContext(ctx)
		require.True(t, ok)
		snap := ledger.Snapshot()
		if strict {
			require.Equal(t, int64(4), snap.Held, "strict: the grant lent to the refused try is held")
			require.Zero(t, snap.Free)
		} else {
			require.Zero(t, snap.Held, "lenient: a refusal naming the try refunds its grant")
			require.Equal(t, int64(4), snap.Free)
		}
	}
}

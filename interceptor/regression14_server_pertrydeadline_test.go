package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/status"
)

// DESIGN.md §3.1: PerTryTimeout only stops the *client* waiting; with a record
// store the handler runs detached with deadline exactly d + skew, and the
// owner learns the outcome by querying. A recorded try whose per-try timeout
// is shorter than the class's expected service time, but whose attempt has
// ample time left, must therefore be admitted: its handler's deadline is
// d + skew, not the client's per-try wait. The server gives admission the
// grpc-timeout (in.until) instead, so every try is refused
// DEADLINE_UNREACHABLE and the call never runs although it fits.
func TestRegression14RecordedTryAdmittedByItsHandlerDeadline(t *testing.T) {
	for _, perTry := range []time.Duration{0, 200 * time.Millisecond} {
		t.Run(perTry.String(), func(t *testing.T) { recordedTryAdmitted(t, perTry) })
	}
}

func recordedTryAdmitted(t *testing.T, perTry time.Duration) {
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4, ExpectedServiceTime: time.Second}),
		admission.WithDefaultClass("work"),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })

	ledger := newLedger(nil) // answers at once
	end := mintedServer(t, &ledger.Service, memoryStore(t),
		interceptor.WithAdmission(ctrl), interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(20*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: perTry,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...))
	resp, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	require.NoError(t, err, "a try with 20 s of attempt left and a 1 s expected service time fits: kind=%v reason=%v err=%v",
		o.Kind, status.ReasonName(o.Reason), err)
	require.Equal(t, int64(1), resp.GetTotal())
	require.Equal(t, int64(1), ledger.effects.Load())
}

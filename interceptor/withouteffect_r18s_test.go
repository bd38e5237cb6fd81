package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A user's handler named the refusal it returned, without effect, with
// status.With(status.WithoutEffect(na), status.WithMessage(…)); With dropped
// the WithoutEffect marker, so the server read a refusal from below a
// handler that ran and answered UNKNOWN, which the caller may not repeat
// without a query. The answer is the handler's NOT_ADMITTED.
func TestHandlerRefusalNamedWithWithStaysNotAdmitted_r18s(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		na := status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
		return nil, status.With(status.WithoutEffect(na), status.WithMessage("stock service busy"))
	}}
	end := recordedServer(t, svc, memoryStore(t))
	_, err := testingv1.NewTestServiceClient(end.DialT(t)).Apply(t.Context(), &testingv1.ApplyRequest{Key: "k", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonQueueFull, o.Reason)
	require.Contains(t, err.Error(), "stock service busy")
}

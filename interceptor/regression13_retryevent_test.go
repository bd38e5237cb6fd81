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
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestRegression13RetryEventNamesTheTryAboutToBeSent: an explicitly keyed call's
// first try is refused ATTEMPT_FENCED through try 5, so the owner continues
// at try 6 (DESIGN.md §2.2: the ballot jump does not count against its
// tries). The tollgate.retry event (try, reason, delay) is recorded with
// try = the count of tries the policy has used + 1 (here 1) — the number
// client.wait was given for the backoff — not the number of the try it
// announces, which the header, the spend event and the span all call 6.
func TestRegression13RetryEventNamesTheTryAboutToBeSent(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	var calls atomic.Int32
	// A plain server (no tollgate interceptor) answers the refusal as given.
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if calls.Add(1) == 1 {
			return nil, status.NotAdmitted(status.ReasonAttemptFenced, status.Fields{Try: 1, FencedThroughTry: 5})
		}
		return &testingv1.GetResponse{Value: "v"}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
		interceptor.WithoutRetryBudget(),
		interceptor.WithClientTracerProvider(tp))...))
	_, err := client.Get(interceptor.WithCallKey(t.Context(), "reserve"), &testingv1.GetRequest{})
	require.NoError(t, err)

	var span *tracetest.SpanStub
	for i, s := range spans.GetSpans() {
		if s.Name == "tollgate.call" {
			span = &spans.GetSpans()[i]
		}
	}
	require.NotNil(t, span)
	var spendTries, retryTries []int64
	for _, e := range span.Events {
		v, _ := attr(e.Attributes, "tollgate.try")
		switch e.Name {
		case "tollgate.allowance.spend":
			spendTries = append(spendTries, v.AsInt64())
		case "tollgate.retry":
			retryTries = append(retryTries, v.AsInt64())
		}
	}
	final, _ := attr(span.Attributes, "tollgate.try")
	require.Equal(t, []int64{1, 6}, spendTries, "precondition: tries 1 and 6 were sent")
	require.Equal(t, int64(6), final.AsInt64(), "precondition: the span ends at try 6")
	require.Equal(t, []int64{6}, retryTries, "the tollgate.retry event must name the try it announces")
}

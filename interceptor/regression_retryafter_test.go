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

// A peer's retry-after is honoured as a floor on the wait before a repeat; a
// very long one (RetryInfo or the detail's retry_after, ≥ ~243 years, or a
// Duration that saturates) overflowed in RetryPolicy.backoff to a negative
// floor, and the client repeated after the ordinary ≤ 20 ms backoff instead
// of concluding (found by review). The suggested wait cannot fit the
// deadline, so there is one try only.
func TestHugeRetryAfterDoesNotOverflow(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.Fields{RetryAfter: time.Duration(1<<63 - 1)})
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register) // the peer sends no pushback trailer
	c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAttemptTimeout(5*time.Second))...))
	start := time.Now()
	_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	t.Logf("err=%v runs=%d took=%v", err, runs.Load(), time.Since(start))
	require.Equal(t, int32(1), runs.Load(), "the peer asked for a wait far past the deadline; the client repeated at once")
}

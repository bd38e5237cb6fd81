package interceptor_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// TestRegression10HugeInitialBackoffIsRefusedOrHarmless: RetryPolicy.withDefaults
// now gives MaxBackoff the value of an InitialBackoff set above 1 s, so a
// policy that sets only InitialBackoff: math.MaxInt64 ("as long as it takes")
// passes validation (before today it was refused: max backoff 1 s below
// initial). At the first repeat, backoff computes rand.N(ceiling+1) with
// ceiling = MaxInt64: the +1 overflows and rand.N panics in the caller's
// goroutine. Either NewDialOptions refuses the policy, or a repeat does not
// panic.
func TestRegression10HugeInitialBackoffIsRefusedOrHarmless(t *testing.T) {
	p := interceptor.RetryPolicy{InitialBackoff: math.MaxInt64}
	opts, err := interceptor.NewDialOptions(interceptor.WithRetry(p))
	if err != nil {
		require.ErrorIs(t, err, interceptor.ErrInvalidOption)
		return // refused at construction: fine
	}
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull) // not final: the owner may repeat
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) })
	client := testingv1.NewTestServiceClient(end.DialT(t, opts...))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NotPanics(t, func() {
		_, err = client.Get(ctx, &testingv1.GetRequest{Key: "k"})
	}, "a policy NewDialOptions accepted panics at its first repeat")
	require.Error(t, err)
}

package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A server that does not speak tollgate (no server interceptor) whose
// handler takes effect, then calls a tollgate server through a tollgate
// client (a new attempt) and relays that call's error and trailers, as a
// gateway does. The deep server refuses its trusted caller and, since r18,
// reports tollgate-spent 0 on the refusal. The origin must still read the
// relayed refusal, which names another attempt, as UNKNOWN (the handler
// ran): DESIGN §3.6.
func TestR18vRelayedRefusalWithCopiedTrailerStaysUnknown(t *testing.T) {
	deep := &testsvc.Service{}
	deep.ApplyFunc = func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonQueueFull))
	}
	deepEnd := testsvc.StartT(t, testsvc.Bufconn, deep.Register, serverOpts()...)
	deepClient := testingv1.NewTestServiceClient(deepEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	var effects atomic.Int32
	mid := &testsvc.Service{}
	mid.ApplyFunc = func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		effects.Add(1)
		var tr metadata.MD
		resp, err := deepClient.Apply(context.Background(), r, grpc.Trailer(&tr))
		_ = grpc.SetTrailer(ctx, tr)
		return resp, err
	}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register) // no tollgate
	client := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
	require.NoError(t, err)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
	require.Equal(t, int32(1), effects.Load())
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
}

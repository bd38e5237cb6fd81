package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// f78bea8 gave every RefusedUnverifiable without VerifiableFrom one
// message (msgUnverifiable, records.go): "the attempt was created longer
// ago than the store keeps records (its TTL, less the clock skew) ... or
// its ID's time lies ahead of this server's clock". Both stores also refuse
// that way an attempt ID that is not a UUIDv7 (memory.go: !isV7;
// idempotency.ValidateKey accepts such IDs: "well formed but lies outside
// every store's horizon"), which has no creation time at all: a trusted
// non-Go peer minting its own IDs is told to look at the store's TTL and
// its clocks, which cannot help. The message should name the actual cause.
func TestRegression15ServerUnverifiableMsg(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAttemptStore(memoryStore(t)))...)
	c := testingv1.NewTestServiceClient(end.DialT(t))
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=order-42;c=0;t=1")
	_, err := c.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
	require.Error(t, err)
	msg := grpcstatus.Convert(err).Message()
	require.NotContains(t, msg, "created longer ago than the store keeps records",
		"an attempt ID with no time (not a UUIDv7) is refused with a cause that does not apply: %q", msg)
}

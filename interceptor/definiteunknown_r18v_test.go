package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// TestR18vUnknownWithDefiniteCodeReportsSpent: an UNKNOWN outcome keeps
// its cause's code, which may be a definite one (an IDEMPOTENT handler's
// call refused locally CALL_KEY_REQUIRED, INVALID_ARGUMENT, passed up; a
// handler's own OutcomeUnknown of a FAILED_PRECONDITION). A lenient caller
// settles a definite code without tollgate-spent only when the answer has
// no tollgate detail (KindFailed): an UNKNOWN detail makes it hold the
// grant, which a callee without records never reconciles. So the server
// must report tollgate-spent (0 here: nothing was sent below) on such an
// answer too, as it does for an UNKNOWN with a code that is not definite;
// before, the caller's grant stayed held for the rest of the attempt.
func TestR18vUnknownWithDefiniteCodeReportsSpent(t *testing.T) {
	mid := &testsvc.Service{}
	end := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	conn := end.DialT(t, interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...)
	client := testingv1.NewTestServiceClient(conn)
	mid.PutFunc = func(ctx context.Context, _ *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		// An IDEMPOTENT handler's unkeyed call to a method with side
		// effects: refused locally, never sent, nothing spent.
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "x"})
		return nil, err
	}
	mid.ApplyFunc = func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, status.OutcomeUnknown(grpcstatus.Error(codes.FailedPrecondition, "half done"))
	}

	t.Run("call key required below", func(t *testing.T) {
		ctx, a := sixUnitAttempt(t)
		var trailer metadata.MD
		_, err := client.Put(ctx, &testingv1.PutRequest{Key: "k"}, grpc.Trailer(&trailer))
		require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
		requireSettledUnknown(t, err, trailer, a)
	})
	t.Run("handler's own unknown", func(t *testing.T) {
		ctx, a := sixUnitAttempt(t)
		var trailer metadata.MD
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"}, grpc.Trailer(&trailer))
		require.Equal(t, codes.FailedPrecondition, grpcstatus.Code(err), "%v", err)
		requireSettledUnknown(t, err, trailer, a)
	})
}

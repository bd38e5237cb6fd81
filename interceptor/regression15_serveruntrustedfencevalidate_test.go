package interceptor_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// README (AttemptService): "Malformed IDs, call keys, methods and
// fence_through_try 0 are INVALID_ARGUMENT with a message saying which."
// The interceptor answers an untrusted peer's FenceAttempt with an UNKNOWN
// record before the service sees it, whatever the request holds: an empty
// attempt ID, a bad method and fence_through_try 0 all read as a valid
// question answered UNKNOWN.
func TestRegression15ServerUntrustedFenceValidate(t *testing.T) {
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0))...) // no peer trusted
	client := tollgatev1.NewAttemptServiceClient(end.DialT(t))
	rec, err := client.FenceAttempt(t.Context(), &tollgatev1.FenceAttemptRequest{AttemptId: "", Call: "", Method: "not a method", FenceThroughTry: 0})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "a malformed FenceAttempt was answered %v (record %v)", err, rec)
}

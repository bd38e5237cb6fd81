package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A trusted peer's malformed tollgate header is refused MALFORMED_HEADER on
// the data path, and was silently ignored on the control path: the
// AttemptService query ran under the server's tenant function instead of
// being refused (DESIGN §2.1), and was not counted as malformed (found by
// review).
func TestControlPathRefusesTrustedMalformedHeader(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	end := recordedServer(t, svc, memoryStore(t))
	conn := end.DialT(t)
	bad := metadata.AppendToOutgoingContext(context.Background(), "tollgate", "a=x;n=a", "tollgate", "a=x;n=b") // repeated header
	_, err := testingv1.NewTestServiceClient(conn).Apply(bad, &testingv1.ApplyRequest{Key: "k"})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err))
	require.Equal(t, status.ReasonMalformedHeader, status.OutcomeOf(err).Reason)

	_, err = tollgatev1.NewAttemptServiceClient(conn).FenceAttempt(bad, &tollgatev1.FenceAttemptRequest{
		AttemptId: "01a22bcd-4490-7a20-a651-a5fcfed10e60", Call: "0", Method: "/x.Y/Z", FenceThroughTry: 1})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "the same header on FenceAttempt: %v", err)
	require.Equal(t, status.ReasonMalformedHeader, status.OutcomeOf(err).Reason)
	require.True(t, status.IsFinal(err))
}

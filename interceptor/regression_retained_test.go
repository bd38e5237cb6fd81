package interceptor_test

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
)

// A stream's record is stored SUCCEEDED with response_retained true and an
// empty response: an operator's GetAttempt is told a response was kept.
func TestRegressionStreamRecordClaimsRetainedResponse(t *testing.T) {
	svc := &testsvc.Service{UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		for {
			if _, err := st.Recv(); err == io.EOF {
				return st.SendAndClose(&testingv1.UploadResponse{Count: 7})
			} else if err != nil {
				return err
			}
		}
	}}
	end := recordedServer(t, svc, memoryStore(t))
	conn := end.DialT(t, interceptor.DialOptions()...)
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(ctx)
	st, err := testingv1.NewTestServiceClient(conn).Upload(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.UploadRequest{Value: "x"}))
	_, err = st.CloseAndRecv()
	require.NoError(t, err)
	rec, err := tollgatev1.NewAttemptServiceClient(conn).GetAttempt(t.Context(), &tollgatev1.GetAttemptRequest{
		AttemptId: a.ID, Call: "0", Method: testingv1.TestService_Upload_FullMethodName})
	require.NoError(t, err)
	t.Logf("state=%v retained=%v len(response)=%d", rec.GetState(), rec.GetResponseRetained(), len(rec.GetResponse()))
	require.False(t, rec.GetResponseRetained(), "a stream's response is never kept")
}

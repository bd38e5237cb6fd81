package interceptor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// A review found that a handler's definite error was passed up, and kept in
// its call's FAILED record, with its status message and details unbounded,
// although tollgate bounds those of every outcome it builds (status,
// # Messages). A record is answered in the body of an AttemptService
// query, which an owner receives within the call's receive limit plus 64
// KiB for the record (4 MiB + 64 KiB by default): a FAILED record whose
// message was larger could not be read, and an owner that lost the try's
// reply (a per-try timeout) and asked the record ended the call UNKNOWN,
// where the handler had failed it definitely. A caller whose header list
// limit is 8 KiB (grpc-java's and gRPC C++'s default) lost even the direct
// answer to a transport INTERNAL. The server now bounds a definite answer's
// message and details as tollgate's own (1 KiB of message, 3 KiB of
// details), the same in the answer and in the record, so every try reads
// the same definite error.
func TestReview13DefiniteErrorIsBounded(t *testing.T) {
	big := strings.Repeat("x", 5<<20) // past a query's default receive limit
	for _, tc := range []struct {
		name string
		err  func(t *testing.T) error
	}{
		{"message", func(*testing.T) error { return grpcstatus.Error(codes.InvalidArgument, "bad request: "+big) }},
		{"details", func(t *testing.T) error {
			p := grpcstatus.New(codes.InvalidArgument, "bad request").Proto()
			for i := range 3 {
				a, err := anypb.New(&errdetails.DebugInfo{Detail: fmt.Sprintf("%d", i) + strings.Repeat("y", 2<<20)})
				require.NoError(t, err)
				p.Details = append(p.Details, a)
			}
			return grpcstatus.FromProto(p).Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := memoryStore(t)
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return nil, tc.err(t)
			}}
			end := recordedServer(t, svc, store)
			client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithMaxHeaderListSize(8<<10)))
			query := tollgatev1.NewAttemptServiceClient(end.DialT(t))

			id, _ := uuid.NewV7()
			d := time.Now().Add(5 * time.Second).UnixMilli()
			hdr := func(n int) context.Context {
				return metadata.AppendToOutgoingContext(t.Context(), "tollgate", fmt.Sprintf("a=%s;c=0;t=%d;d=%d", id, n, d))
			}
			_, err := client.Apply(hdr(1), &testingv1.ApplyRequest{Key: "k"})
			first := grpcstatus.Convert(err)
			require.Equal(t, codes.InvalidArgument, first.Code(), "the definite answer arrives: %.300v", err)

			// The owner's query after a lost reply reads the record.
			rec, err := query.FenceAttempt(hdr(1), &tollgatev1.FenceAttemptRequest{AttemptId: id.String(), Call: "0",
				Method: testingv1.TestService_Apply_FullMethodName, FenceThroughTry: 1})
			require.NoError(t, err, "the record can be read")
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, rec.GetState())
			require.EqualValues(t, codes.InvalidArgument, rec.GetStatusCode())
			require.LessOrEqual(t, len(rec.GetStatusMessage()), 1<<10)
			size := 0
			for _, a := range rec.GetStatusDetails() {
				size += len(a.GetTypeUrl()) + len(a.GetValue())
			}
			require.LessOrEqual(t, size, 3<<10)

			// A later try is answered by the record, as the first was.
			_, err = client.Apply(hdr(2), &testingv1.ApplyRequest{Key: "k"})
			require.Equal(t, first.Proto().String(), grpcstatus.Convert(err).Proto().String(), "every try reads the same answer")
			require.EqualValues(t, 1, svc.Calls("Apply"))
		})
	}
}

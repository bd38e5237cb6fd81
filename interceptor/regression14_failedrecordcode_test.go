package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found that a FAILED record's code was passed through as it was:
// an AttemptService of another make that keeps a FAILED record with
// UNAVAILABLE ended the call with a bare UNAVAILABLE, which generic retry
// policies repeat, and which DESIGN.md §2.5 rules out for an outcome in
// doubt. A FAILED record whose code is not definite now ends the call
// UNKNOWN, naming the try; a definite one still ends it with that error.
func TestRegression14FailedRecordWithoutDefiniteCodeIsUnknown(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		kind status.Kind
	}{{codes.Unavailable, status.KindUnknown}, {codes.NotFound, status.KindFailed}} {
		t.Run(tc.code.String(), func(t *testing.T) {
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return nil, grpcstatus.Error(codes.Internal, "effect done, then failed")
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				svc.Register(s)
				tollgatev1.RegisterAttemptServiceServer(s, wrongAnswers{answer: func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
					return &tollgatev1.AttemptRecord{AttemptId: r.GetAttemptId(), Call: r.GetCall(), Method: r.GetMethod(),
						State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, Try: r.GetFenceThroughTry(),
						StatusCode: int32(tc.code), StatusMessage: "as the record says"}
				}})
			})
			c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
			_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			o := status.OutcomeOf(err)
			require.Equal(t, tc.kind, o.Kind, "%v", err)
			if tc.kind == status.KindUnknown {
				require.NotEqual(t, codes.Unavailable, grpcstatus.Code(err), "never a bare UNAVAILABLE")
				require.NotEmpty(t, o.Detail.GetAttemptId())
			} else {
				require.Equal(t, tc.code, grpcstatus.Code(err))
			}
		})
	}
}

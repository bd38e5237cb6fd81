package interceptor_test

import (
	"context"
	"sync/atomic"
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

// wrongAnswers is an AttemptService that answers FenceAttempt with a record
// of its answer function's making: a buggy or foreign implementation.
type wrongAnswers struct {
	tollgatev1.UnimplementedAttemptServiceServer
	answer func(*tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord
}

func (w wrongAnswers) FenceAttempt(_ context.Context, r *tollgatev1.FenceAttemptRequest) (*tollgatev1.AttemptRecord, error) {
	return w.answer(r), nil
}

// The owner repeats a try in doubt only on an answer to the question it
// asked: a FENCED record of another call, or a fence below the try in
// doubt, says nothing of that try, which may have run. Before, the owner
// trusted any FENCED answer and repeated (found by review, as hardening).
func TestAnswerForAnotherCallOrTryIsNotTrusted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(*tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord
	}{
		{"another call", func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
			return &tollgatev1.AttemptRecord{AttemptId: r.GetAttemptId(), Call: r.GetCall() + "x", Method: r.GetMethod(),
				State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, FencedThroughTry: r.GetFenceThroughTry()}
		}},
		{"another attempt", func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
			return &tollgatev1.AttemptRecord{AttemptId: "01a22bcd-4490-7a20-a651-a5fcfed10e60", Call: r.GetCall(), Method: r.GetMethod(),
				State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, FencedThroughTry: r.GetFenceThroughTry()}
		}},
		{"a fence below the try", func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
			return &tollgatev1.AttemptRecord{AttemptId: r.GetAttemptId(), Call: r.GetCall(), Method: r.GetMethod(),
				State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, FencedThroughTry: r.GetFenceThroughTry() - 1}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int32
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				runs.Add(1)
				return nil, grpcstatus.Error(codes.Internal, "effect done, then failed")
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				svc.Register(s)
				tollgatev1.RegisterAttemptServiceServer(s, wrongAnswers{answer: tc.answer})
			})
			c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
			_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			require.Equal(t, int32(1), runs.Load(), "a try in doubt was repeated on an answer about something else")
			require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
		})
	}
}

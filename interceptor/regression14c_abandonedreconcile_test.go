package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// A review found that (DESIGN.md §3.3) a held grant moves to spent and free only from a record
// finished as SUCCEEDED, FAILED, FENCED or UNKNOWN — never IN_PROGRESS or
// ABANDONED. The owner decides by the record's finished_at, not its state:
// an ABANDONED (or IN_PROGRESS) answer that carries finished_at (an
// AttemptService or store of another make) refunds the held grant.
func TestRegression14cAbandonedRecordDoesNotReconcile(t *testing.T) {
	for _, st := range []tollgatev1.AttemptState{
		tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED,
	} {
		t.Run(st.String(), func(t *testing.T) {
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return nil, grpcstatus.Error(codes.Internal, "effect done, then failed")
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				svc.Register(s)
				tollgatev1.RegisterAttemptServiceServer(s, wrongAnswers{answer: func(r *tollgatev1.FenceAttemptRequest) *tollgatev1.AttemptRecord {
					return &tollgatev1.AttemptRecord{AttemptId: r.GetAttemptId(), Call: r.GetCall(), Method: r.GetMethod(),
						State: st, Try: r.GetFenceThroughTry(), FinishedAt: timestamppb.Now()}
				}})
			})
			c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
			ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
			require.NoError(t, err)
			_, err = c.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
			require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
			a, _ := budget.FromContext(ctx)
			snap := a.Snapshot()
			require.Equal(t, int64(4), snap.Held+snap.Spent,
				"an %v record moved the held grant back to free: %+v", st, snap)
		})
	}
}

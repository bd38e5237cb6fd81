package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc/metadata"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// f78bea8 makes a server whose interceptor has no WithAttemptStore answer
// FenceAttempt UNIMPLEMENTED "whatever service is registered: its data path
// keeps no records, so a fence would tell the owner a try never ran when it
// may have" (README). GetAttempt on the same server still reaches the
// registered service and answers UNSEEN for a call whose handler ran and
// committed: tollgate.proto defines UNSEEN as "the store holds no record and
// can vouch that it would", which this server cannot (DESIGN.md §3.8:
// absence is evidence only where records are kept). An operator or tool
// reading it (GetAttempt is "for operators and tools") concludes the try
// never ran and runs it again — the very false answer the fence change
// removed. GetAttempt should be answered as FenceAttempt is (UNIMPLEMENTED),
// or UNKNOWN.
func TestRegression15ServerNoStoreGet(t *testing.T) {
	store := memoryStore(t)
	var runs atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		runs.Add(1)
		return &testingv1.ApplyResponse{Total: 1}, nil
	}}
	conn := storelessServer(t, store, svc.Register).DialT(t)

	time.Sleep(2 * time.Millisecond) // the attempt is created after the store's horizon
	id, err := interceptor.StartAttempt(t.Context(), 0, 30*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(id)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID+";c=0;t=1;d="+itoa(a.Deadline.UnixMilli()))
	_, err = testingv1.NewTestServiceClient(conn).Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
	require.NoError(t, err)
	require.Equal(t, int64(1), runs.Load())

	rec, err := tollgatev1.NewAttemptServiceClient(conn).GetAttempt(metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID),
		&tollgatev1.GetAttemptRequest{AttemptId: a.ID, Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	if err == nil {
		require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN.String(), rec.GetState().String(),
			"the call ran and committed, but this server (no WithAttemptStore) vouches that no try of it started")
	}
}

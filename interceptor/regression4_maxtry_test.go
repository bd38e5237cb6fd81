package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// highFence answers every fence with a tombstone through try 1000 (the
// header's last try), as a callee whose explicit key was fenced that far.
type highFence struct{ *idempotency.MemoryStore }

func (s highFence) Fence(ctx context.Context, key idempotency.Key, through uint32) (*tollgatev1.AttemptRecord, error) {
	return &tollgatev1.AttemptRecord{AttemptId: key.AttemptID, Call: key.Call, Method: key.Method,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, FencedThroughTry: 1000}, nil
}

func TestRegressionStreamFenceAtMaxTry(t *testing.T) {
	var tries atomic.Int32
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		tries.Add(1)
		return grpcstatus.Error(codes.Internal, "boom") // UNKNOWN, nothing sent
	}}
	end := recordedServer(t, svc, highFence{memoryStore(t)})
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAttemptTimeout(10*time.Second))...))
	st, err := client.Chat(t.Context())
	require.NoError(t, err)
	_, err = st.Recv()
	o := status.OutcomeOf(err)
	t.Logf("handler runs %d; stream result: kind %v reason %v: %v", tries.Load(), o.Kind, status.ReasonName(o.Reason), err)
	require.Equal(t, status.ReasonAttemptFenced, o.Reason, "as a unary call: the fence reached the last try the header can carry")
}

package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc/metadata"
)

// A review found that FenceAttempt on a call of a method declared
// NO_SIDE_EFFECTS stored a tombstone and answered FENCED: "no try ≤ n of
// this call will ever run", with units_spent 0. Such calls keep no records
// (DESIGN.md §3.7): their tries run whatever the store holds, so the answer
// was false while a try ran, and an owner whose build declared the method
// otherwise (a rolling deploy that changed its idempotency_level) would
// repeat on it and free the grant of a try that ran and may have spent
// units below (§3.3), while the tombstone filled the store for nothing. The
// server now answers such a ballot UNKNOWN, as it answers one it cannot
// honour, and stores nothing.
func TestReview13FenceOfNoSideEffectsCallStoresNothing(t *testing.T) {
	store := memoryStore(t)
	started, release := make(chan struct{}), make(chan struct{})
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		close(started)
		<-release
		return &testingv1.GetResponse{}, nil
	}}
	end := recordedServer(t, svc, store)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	query := tollgatev1.NewAttemptServiceClient(end.DialT(t))

	id, _ := uuid.NewV7()
	hdr := fmt.Sprintf("a=%s;c=0;t=1;d=%d;u=3", id, time.Now().Add(5*time.Second).UnixMilli())
	done := make(chan error, 1)
	go func() {
		_, err := client.Get(metadata.AppendToOutgoingContext(t.Context(), "tollgate", hdr), &testingv1.GetRequest{Key: "k"})
		done <- err
	}()
	<-started // try 1 runs

	rec, err := query.FenceAttempt(metadata.AppendToOutgoingContext(t.Context(), "tollgate", hdr),
		&tollgatev1.FenceAttemptRequest{AttemptId: id.String(), Call: "0", Method: testingv1.TestService_Get_FullMethodName, FenceThroughTry: 1})
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, err)
	require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(),
		"try 1 was running: a tombstone's promise that it never will is false (%v)", rec)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())

	got, err := store.Get(t.Context(), idempotency.Key{AttemptID: id.String(), Call: "0", Method: testingv1.TestService_Get_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, got.GetState(), "nothing was stored")
}

package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/metadata"
)

// A review found that the first fix gives admission the attempt's deadline (d + skew) for a recorded
// unary try, because its *handler* runs detached until then. But the try's
// wait in the admission queue is not detached: it ends with the client's
// context (its per-try grpc-timeout). A try whose predicted wait (≈2 s
// behind a running request) far exceeds its own 300 ms timeout is now queued
// rather than refused DEADLINE_UNREACHABLE: it can never start, its client
// gets no typed refusal and no retry-after (only its own DEADLINE_EXCEEDED,
// an UNKNOWN that needs a FenceAttempt to resolve), and the controller counts
// a DEADLINE_EXPIRED drop (a dequeue deadline miss, overload) for a request
// whose deadline, as admission was told, was 20 s away.
func TestRegression14bDetachedTryQueuedPastItsOwnWait(t *testing.T) {
	var (
		mu     sync.Mutex
		events []admission.Event
	)
	ended := make(chan struct{}, 16) // a request left unrun: refused, or dropped from the queue
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 4, ExpectedServiceTime: 2 * time.Second}),
		admission.WithDefaultClass("work"),
		admission.WithObserver(func(e admission.Event) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
			if e.Kind == admission.EventRefused || e.Kind == admission.EventDropped {
				ended <- struct{}{}
			}
		}),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })

	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	ledger := newLedger(func(ctx context.Context, r *testingv1.ApplyRequest) {
		if r.GetKey() == "hold" {
			entered <- struct{}{}
			<-release
		}
	})
	end := mintedServer(t, &ledger.Service, memoryStore(t),
		interceptor.WithAdmission(ctrl), interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0))
	client := testingv1.NewTestServiceClient(end.DialT(t)) // raw gRPC: the test plays the owner

	send := func(ctx context.Context, key string, perTry time.Duration) error {
		id, err := interceptor.StartAttempt(t.Context(), 0, 20*time.Second)
		require.NoError(t, err)
		a, _ := interceptor.AttemptFromContext(id)
		ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", "a="+a.ID+";c=0;t=1;d="+itoa(a.Deadline.UnixMilli()))
		ctx, cancel := context.WithTimeout(ctx, perTry)
		defer cancel()
		_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: key, Amount: 1})
		return err
	}
	holdDone := make(chan error, 1)
	go func() { holdDone <- send(context.Background(), "hold", 15*time.Second) }()
	<-entered // "hold" runs and holds work's only slot

	err = send(t.Context(), "late", 300*time.Millisecond)
	// Let the server finish with "late" (refused at arrival, or dropped
	// when its context ends) before "hold" frees the slot.
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
	}
	close(release)
	require.NoError(t, <-holdDone)

	mu.Lock()
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind.String()+"/"+status.ReasonName(e.Reason))
	}
	mu.Unlock()
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonDeadlineUnreachable, o.Reason,
		"a try predicted to wait ~2 s with 300 ms of its own to wait must be refused DEADLINE_UNREACHABLE at once; got kind=%v reason=%v err=%v; controller events %v",
		o.Kind, status.ReasonName(o.Reason), err, kinds)
}

package interceptor_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
)

// finishGate is a memory store whose first Finish waits, after closing
// entered, until release is closed: a store slow to finish a record.
type finishGate struct {
	*idempotency.MemoryStore
	once             sync.Once
	entered, release chan struct{}
}

func newFinishGate(t *testing.T) *finishGate {
	return &finishGate{MemoryStore: memoryStore(t), entered: make(chan struct{}), release: make(chan struct{})}
}

func (s *finishGate) Finish(ctx context.Context, req idempotency.FinishRequest) error {
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.entered)
		<-s.release
	}
	return s.MemoryStore.Finish(ctx, req)
}

// A stream's admission slot is its handler's, as a unary call's is: once
// the handler returned, the slot is given back before the record is
// finished, so that a store slow to finish records does not keep the class
// full of streams whose handlers have all ended (a unary call's slot was
// already given back before its finish).
func TestStreamSlotFreeWhileItsRecordIsFinished(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	running := func() int { cs, _ := ctrl.Stats().Class("work"); return cs.Running }
	store := newFinishGate(t)
	c := newConsumer()
	end := startRecorded(t, c, store, []interceptor.ServerOption{interceptor.WithAdmission(ctrl)})
	client := testingv1.NewTestServiceClient(end.DialT(t))
	release := sync.OnceFunc(func() { close(store.release) })
	t.Cleanup(release) // also when an assertion fails first

	done := make(chan error, 1)
	go func() {
		st, err := client.Consume(t.Context(), &testingv1.ConsumeRequest{Key: "k", Count: 1})
		if err == nil {
			_, err = recvConsumed(st)
		}
		done <- err
	}()
	<-store.entered // the handler returned; its record is being finished
	require.Zero(t, running(), "the stream's handler ended: its slot is free while the store finishes its record")
	release()
	require.NoError(t, <-done)
	require.Zero(t, running())
}

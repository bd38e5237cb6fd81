package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"

	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// With a store, a stream's handler still sees the client's cancellation: a
// watch the caller cancels ends and gives its admission slot back, instead of
// running until the attempt's deadline.
func TestRegressionCancelledChatKeepsItsSlot(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	store := memoryStore(t)
	require.NoError(t, err)
	exited := make(chan time.Time, 1)
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		defer func() { exited <- time.Now() }()
		if _, err := st.Recv(); err != nil {
			return err
		}
		if err := st.Send(&testingv1.ChatResponse{}); err != nil {
			return err
		}
		<-st.Context().Done() // the usual watch loop: wait for events or the caller leaving
		return st.Context().Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(store))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	actx, err := interceptor.StartAttempt(t.Context(), 4, 4*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(actx)
	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{}))
	_, err = st.Recv()
	require.NoError(t, err)
	cancel()
	// The attempt's deadline is 4 s away; the handler must see the cancel
	// long before (the bound only stops a hung test), and give its slot back.
	require.Eventually(t, func() bool { return len(exited) == 1 }, 3*time.Second, time.Millisecond,
		"the handler saw the caller cancel before the attempt's deadline")
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Running == 0 }, 3*time.Second, time.Millisecond)
}

package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
)

// Control streams (a reflection session, a health Watch) take no admission
// slot in the interceptor (server.control: "Streams on the control path take
// no slot"), so a full control class cannot delay them. But the admission
// tap classifies reflection as a control method and refuses it QUEUE_FULL
// whenever the control class's slots and queue are taken by AttemptService
// queries: an operator's reflection session is refused for want of a slot
// it would never have used.
func TestRegression14TapDoesNotRefuseSlotlessControlStreams(t *testing.T) {
	queued := make(chan struct{}, 16)
	ctrl, err := admission.New(admission.WithObserver(func(e admission.Event) {
		if e.Kind == admission.EventQueued {
			queued <- struct{}{}
		}
	}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { reflection.Register(s) },
		serverOpts(interceptor.WithAdmission(ctrl))...)

	// AttemptService queries fill the control class: 2 running, 8 waiting.
	q := admission.Request{Method: "/tollgate.v1.AttemptService/GetAttempt", Size: -1}
	for range 2 {
		p, err := ctrl.Admit(t.Context(), q)
		require.NoError(t, err)
		defer p.Release()
	}
	wctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{}, 8)
	defer func() {
		cancel()
		for range 8 {
			<-done
		}
	}()
	for range 8 {
		go func() {
			if p, err := ctrl.Admit(wctx, q); err == nil {
				p.Release()
			}
			done <- struct{}{}
		}()
		<-queued
	}

	ctx, cc := context.WithTimeout(t.Context(), 5*time.Second)
	defer cc()
	st, err := rpb.NewServerReflectionClient(end.DialT(t)).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}))
	_, err = st.Recv()
	require.NoError(t, err, "a reflection session takes no control slot, yet it was refused %s",
		status.ReasonName(status.OutcomeOf(err).Reason))
}

package interceptor_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A client-streaming call from an untrusted peer that opens the stream and
// never sends held its admission slot past the attempt's deadline (server
// maximum 300ms here, skew 0) for as long as the peer kept the stream open:
// the handler's context ended, but grpc-go's RecvMsg waits on the RPC's own
// context, which had no deadline, so the class stayed full (found by
// review). The admission tap now bounds the stream's context by the
// attempt's deadline plus the skew.
func TestIdleClientStreamReleasesItsSlotAtTheAttemptDeadline(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	svc := &testsvc.Service{
		UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			for { // the generated-handler idiom
				if _, err := st.Recv(); err == io.EOF {
					return st.SendAndClose(&testingv1.UploadResponse{})
				} else if err != nil {
					return err
				}
			}
		},
		ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			return &testingv1.ApplyResponse{}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(
		interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(0),
		interceptor.WithMaxAttemptTime(300*time.Millisecond))...)
	client := testingv1.NewTestServiceClient(end.DialT(t)) // raw, untrusted, no deadline

	sctx, scancel := context.WithCancel(t.Context())
	defer scancel()
	_, err = client.Upload(sctx) // opens, sends nothing
	require.NoError(t, err)
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Running == 1 }, 5*time.Second, time.Millisecond)

	// The stream ends at the attempt's deadline (300ms) + skew (0), and its
	// slot with it.
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Running == 0 }, 5*time.Second, time.Millisecond)
	s, _ := ctrl.Stats().Class("work")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
	require.NoError(t, err, "slot still held by an idle stream whose attempt deadline passed 700ms ago (running=%d): %v", s.Running, status.OutcomeOf(err))
}

// The tap's bound is for calls, not the control path: a Health/Watch stream
// lives as long as its client, past the server's maximum attempt time.
func TestTapDoesNotBoundControlStreams(t *testing.T) {
	ctrl, err := admission.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	hs := health.NewServer()
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, hs) },
		interceptor.ServerOptions(interceptor.WithAdmission(ctrl), interceptor.WithClockSkew(0),
			interceptor.WithMaxAttemptTime(100*time.Millisecond))...)
	w, err := healthpb.NewHealthClient(end.DialT(t)).Watch(t.Context(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	first, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, first.GetStatus())
	time.Sleep(300 * time.Millisecond) // three times the maximum attempt time
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	next, err := w.Recv()
	require.NoError(t, err, "the Watch stream outlives the maximum attempt time")
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, next.GetStatus())
}

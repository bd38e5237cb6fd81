package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Two long-lived Health/Watch streams (what grpc-go clients with
// healthCheckConfig open, one per subchannel) hold the control class's two
// slots for their lifetime: FenceAttempt can no longer be answered.
var nWatch = 2

func TestRegressionHealthWatchStarvesControlClass(t *testing.T) {
	ctrl, err := admission.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	store := memoryStore(t)
	require.NoError(t, err)
	hs := health.NewServer()
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		healthpb.RegisterHealthServer(s, hs)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(store))...)
	conn := end.DialT(t, interceptor.DialOptions()...)
	wctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range nWatch {
		w, err := healthpb.NewHealthClient(conn).Watch(wctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = w.Recv()
		require.NoError(t, err)
	}
	qctx, qcancel := context.WithTimeout(t.Context(), 10*time.Second) // only stops a starved (hung) query
	defer qcancel()
	_, err = tollgatev1.NewAttemptServiceClient(conn).GetAttempt(qctx, &tollgatev1.GetAttemptRequest{AttemptId: "x", Call: "0", Method: "/m/m"})
	require.NoError(t, err, "§3.12: the control path stays open")
}

package interceptor_test

import (
	"context"
	"sync"
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

// r91SlowStore is a store whose reads wait for gate: a slow store (a Redis
// that WAITs for replicas, a failover in progress).
type r91SlowStore struct {
	idempotency.Store
	gate chan struct{}
}

func (s *r91SlowStore) Get(ctx context.Context, k idempotency.Key) (*tollgatev1.AttemptRecord, error) {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.Get(ctx, k)
}

// Review 91, DESIGN §3.12 (the control path stays open): health checks
// share the control class's two slots and eight places with AttemptService
// queries, each of which holds its slot for as long as the store takes to
// answer. With the store slow, ten GetAttempt calls (from any peer: no trust
// is needed to read) fill the class, and the health check — which touches no
// store — is refused RESOURCE_EXHAUSTED QUEUE_FULL (with two of them, it
// waits behind the store). An orchestrator then restarts a server whose
// data path may be perfectly healthy. Expected: the health check answers.
func TestRegression13HealthStarvedBySlowAttemptQueries(t *testing.T) {
	ctrl, err := admission.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	mem := memoryStore(t)
	store := &r91SlowStore{Store: mem, gate: make(chan struct{})}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		healthpb.RegisterHealthServer(s, health.NewServer())
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithClockSkew(0), interceptor.WithAdmission(ctrl), interceptor.WithAttemptStore(mem))...)
	conn := end.DialT(t)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(store.gate)
	for range 10 {
		wg.Go(func() {
			_, _ = tollgatev1.NewAttemptServiceClient(conn).GetAttempt(t.Context(),
				&tollgatev1.GetAttemptRequest{AttemptId: "x", Call: "0", Method: "/m.S/M"})
		})
	}
	require.Eventually(t, func() bool { // the queries wait on the store
		c, _ := ctrl.Stats().Class(admission.ControlClass)
		return c.Running == 2 && c.Queued == 8
	}, 10*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // only stops a starved (hung) check
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "§3.12: health answers while AttemptService queries wait on a slow store")
}

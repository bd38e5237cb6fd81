package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// panickyFenceStore is a store whose Fence panics (a bug in a third-party
// store, say); everything else is the memory store's.
type panickyFenceStore struct{ *idempotency.MemoryStore }

func (panickyFenceStore) Fence(context.Context, idempotency.Key, uint32) (*tollgatev1.AttemptRecord, error) {
	panic("store bug")
}

// WithRecovery: "makes the server recover a handler's panic and answer it as
// an UNKNOWN outcome (INTERNAL)". The control path (AttemptService, health,
// reflection) runs its handler outside server.run, so with WithRecovery a
// panic in an AttemptService handler still escapes tollgate's interceptor
// and, without a recovery of the user's own outside it, kills the server.
func TestRegression14RecoveryCoversTheControlPath(t *testing.T) {
	store := panickyFenceStore{memoryStore(t)}
	var escaped atomic.Bool
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil { // stands in for the process dying
				escaped.Store(true)
				err = grpcstatus.Error(codes.Internal, "panic escaped tollgate")
			}
		}()
		return h(ctx, req)
	})
	opts := append([]grpc.ServerOption{outer}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithRecovery())...)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, opts...)
	q := tollgatev1.NewAttemptServiceClient(end.DialT(t))
	_, err := q.FenceAttempt(t.Context(), &tollgatev1.FenceAttemptRequest{
		AttemptId: "01a22d3f-0839-77a0-8306-26e6e3c22c05", Call: "0", Method: "/tollgate.testing.v1.TestService/Apply", FenceThroughTry: 1})
	require.Error(t, err)
	require.False(t, escaped.Load(), "with WithRecovery the AttemptService handler's panic escaped tollgate's interceptor: %v", err)
}

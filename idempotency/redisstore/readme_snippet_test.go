package redisstore_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/interceptor"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
)

// readmeChoosingAStore is the README's "Choosing a store" snippet, kept
// here as written so that a change to the API it uses fails to compile.
// It is not run: it names a Redis at redis:6379.
var _ = func(ctx context.Context) (*grpc.Server, error) {
	var store idempotency.Store
	// Either one replica, ever (a Recreate rollout, never two pods at once):
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica,
		idempotency.WithMaxRecords(100_000), idempotency.WithMaxBytes(256<<20),
		idempotency.WithMaxRecordsPerTenant(20_000), idempotency.WithMaxBytesPerTenant(64<<20)) // optional: no tenant fills it alone
	_ = err // (not in the README: its two stores are alternatives)

	// or several replicas: Redis with maxmemory-policy noeviction.
	// ContextTimeoutEnabled lets a try's deadline bound its store calls; New requires it.
	rdb := redis.NewClient(&redis.Options{Addr: "redis:6379", ContextTimeoutEnabled: true})
	rs, err := redisstore.New(ctx, rdb,
		redisstore.WithPrefix("orders:attempts:"),
		redisstore.WithMaxRecordsPerTenant(20_000),      // optional: no tenant fills it alone
		redisstore.WithReplicas(1, 50*time.Millisecond)) // WAIT for 1 replica (a majority of 2)
	if err != nil {
		log.Fatal(err) // before the defer: a failed New returns no store to close
	}
	defer rs.Close() // after srv.GracefulStop (a Finish after Close fails): ends the store's node checks (rdb stays yours)
	store = rs

	srv := grpc.NewServer(interceptor.ServerOptions(interceptor.WithAttemptStore(store))...)
	tollgatev1.RegisterAttemptServiceServer(srv, idempotency.NewAttemptService(store))
	return srv, err
}

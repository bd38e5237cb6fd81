package idempotency_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/google/uuid"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// The life of one call's record: try 1 begins and succeeds; a repeat of the
// call (try 2, say after a lost response) gets the stored response instead of
// running again.
func ExampleMemoryStore() {
	policy := idempotency.DefaultPolicy()
	policy.Skew = 0 // this example's clocks agree exactly
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(policy))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	key := idempotency.Key{Tenant: "acme", AttemptID: uuid.Must(uuid.NewV7()).String(), Call: "0", Method: "/shop.v1.Orders/Place"}
	fp := idempotency.Fingerprint(key.Method, []byte("3 blue mugs"))
	deadline := time.Now().Add(10 * time.Second)

	res, _ := store.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Fingerprint: fp, Deadline: deadline})
	fmt.Println("try 1 started:", res.Started)
	// … the handler runs and succeeds …
	_ = store.Finish(ctx, idempotency.FinishRequest{Key: key, Try: 1, Fingerprint: fp,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("order placed")})

	res, _ = store.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 2, Fingerprint: fp, Deadline: deadline})
	fmt.Println("try 2 started:", res.Started, "refusal:", res.Refusal, "record:", res.Record.GetState())
	fmt.Printf("replayed response: %s\n", res.Record.GetResponse())
	// Output:
	// try 1 started: true
	// try 2 started: false refusal: FINISHED record: ATTEMPT_STATE_SUCCEEDED
	// replayed response: order placed
}

// An owner whose try's outcome is unknown casts its ballot: FenceAttempt
// through try 1. The call never reached this server, so the record becomes
// a tombstone and the owner may send try 2.
func ExampleNewAttemptService() {
	policy := idempotency.DefaultPolicy()
	policy.Skew = 0
	store, _ := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(policy))
	srv := grpc.NewServer()
	tollgatev1.RegisterAttemptServiceServer(srv, idempotency.NewAttemptService(store,
		idempotency.WithTenant(func(context.Context) string { return "acme" })))
	lis := bufconn.Listen(1 << 16)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, _ := grpc.NewClient("passthrough:///attempts",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()

	rec, err := tollgatev1.NewAttemptServiceClient(conn).FenceAttempt(context.Background(), &tollgatev1.FenceAttemptRequest{
		AttemptId: uuid.Must(uuid.NewV7()).String(), Call: "0", Method: "/shop.v1.Orders/Place", FenceThroughTry: 1,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(rec.GetState(), "through try", rec.GetFencedThroughTry())
	// Output:
	// ATTEMPT_STATE_FENCED through try 1
}

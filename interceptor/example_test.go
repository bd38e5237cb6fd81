package interceptor_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	quickstartv1 "github.com/tollgate-go/tollgate/examples/quickstart/proto/quickstart/v1"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// busyOrders is a quick-start OrderService whose handler refuses every
// order as if its own queue were full, and counts the tries that reached
// it.
type busyOrders struct {
	quickstartv1.UnimplementedOrderServiceServer
	tries atomic.Int64
}

func (s *busyOrders) PlaceOrder(context.Context, *quickstartv1.PlaceOrderRequest) (*quickstartv1.PlaceOrderResponse, error) {
	s.tries.Add(1)
	// PlaceOrder changes state: status.WithoutEffect says this refusal
	// took no effect, so it reaches the client as NOT_ADMITTED and may be
	// repeated. Without it the server would answer UNKNOWN (DESIGN.md §3.6).
	return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond)))
}

// A server that refuses with a typed outcome, and a client whose one call
// repeats the refusal inside its attempt, then reports what it may
// conclude. Server and client talk over an in-memory connection (bufconn);
// the service is the quick start's (examples/quickstart).
func Example() {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(interceptor.ServerOptions(
		interceptor.WithTrustedPeer(interceptor.TrustAll), // an in-memory peer has no address to trust
	)...)
	orders := &busyOrders{}
	quickstartv1.RegisterOrderServiceServer(srv, orders)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///bufconn", append(interceptor.DialOptions(
		interceptor.WithAllowance(4),
		interceptor.WithAttemptTimeout(5*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
	)...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	_, err = quickstartv1.NewOrderServiceClient(conn).PlaceOrder(context.Background(), &quickstartv1.PlaceOrderRequest{Item: "book"})
	o := status.OutcomeOf(err)
	fmt.Println("outcome:", o.Kind, status.ReasonName(o.Reason))
	fmt.Println("tries that reached the server:", orders.tries.Load())
	fmt.Println("attempt ID is a UUIDv7:", len(o.Detail.GetAttemptId()) == 36 && o.Detail.GetAttemptId()[14] == '7')
	// Output:
	// outcome: NOT_ADMITTED QUEUE_FULL
	// tries that reached the server: 2
	// attempt ID is a UUIDv7: true
}

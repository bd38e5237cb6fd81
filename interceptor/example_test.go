package interceptor_test

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A server that refuses with a typed outcome, and a client whose one call
// repeats the refusal inside its attempt, then reports what it may conclude.
// Get is declared NO_SIDE_EFFECTS in its proto, so its handler's refusal
// reaches the client as NOT_ADMITTED. A handler of a method with side
// effects refuses with status.WithoutEffect(status.NotAdmitted(...)) to say
// that nothing took effect; without it the server answers UNKNOWN
// (DESIGN.md §3.6).
func Example() {
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))
	}}
	end, err := testsvc.Start(testsvc.Bufconn, svc.Register,
		interceptor.ServerOptions(interceptor.WithTrustedPeer(interceptor.TrustAll))...)
	if err != nil {
		panic(err)
	}
	defer end.Stop()
	conn, err := end.Dial(interceptor.DialOptions(
		interceptor.WithAllowance(4),
		interceptor.WithAttemptTimeout(5*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	_, err = testingv1.NewTestServiceClient(conn).Get(context.Background(), &testingv1.GetRequest{Key: "k"})
	o := status.OutcomeOf(err)
	fmt.Println("outcome:", o.Kind, status.ReasonName(o.Reason))
	fmt.Println("tries that reached the server:", svc.Calls("Get"))
	fmt.Println("attempt ID is a UUIDv7:", len(o.Detail.GetAttemptId()) == 36 && o.Detail.GetAttemptId()[14] == '7')
	// Output:
	// outcome: NOT_ADMITTED QUEUE_FULL
	// tries that reached the server: 2
	// attempt ID is a UUIDv7: true
}

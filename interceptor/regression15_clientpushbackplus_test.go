package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// parsePushback claims to read grpc-retry-pushback-ms "as grpc-go does",
// but grpc-go reads each value with strconv.Atoi (stream.go shouldRetry:
// err != nil || sp < 0 means do not retry), which accepts a sign ("+5",
// "-0") and leading zeros past 10 characters ("000000000005"). tollgate
// reads these as "do not retry" and ends the call after one try, where
// grpc-go's own retry would repeat it after 5 ms. (The shed refusal is one
// the owner repeats without the trailer: see the control subtest.)
func TestRegression15ClientPushbackPlus(t *testing.T) {
	for _, v := range []string{"5 (control)", "+5", "-0", "000000000005"} {
		t.Run(v, func(t *testing.T) {
			val := v
			if val == "5 (control)" {
				val = "5"
			}
			runs, err := getPushedBack(t, val)
			require.NoError(t, err, "grpc-go reads pushback %q as a delay of %s and retries; tollgate stopped after %d try", val, "5 ms", runs)
			require.Equal(t, int64(2), runs)
		})
	}
}

// getPushedBack sends one Get, under a policy of three tries, to a server
// whose first run refuses it without effect with grpc-retry-pushback-ms
// pushback and whose later runs answer; it returns the runs and the call's
// error.
func getPushedBack(t *testing.T, pushback string) (int64, error) {
	t.Helper()
	var runs atomic.Int64
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if runs.Add(1) == 1 {
			_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", pushback))
			return nil, shed()
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	return runs.Load(), err
}

package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §2.1: a malformed tollgate header, from a trusted peer or not,
// "is counted in a metric" (tollgate.metadata.malformed). The control path
// counts an untrusted peer's malformed header on GetAttempt, but a
// FenceAttempt from an untrusted peer is answered UNKNOWN before its header
// is looked at, so the same malformed header goes uncounted there.
func TestRegression15ServerFenceMalformed(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0),
		interceptor.WithServerMeterProvider(mp))...) // no peer trusted
	client := tollgatev1.NewAttemptServiceClient(end.DialT(t))
	bad := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x y") // bad charset
	id := "01a22bcd-4490-7a20-a651-a5fcfed10e60"

	_, err := client.GetAttempt(bad, &tollgatev1.GetAttemptRequest{AttemptId: id, Call: "0", Method: "/x.Y/Z"})
	require.NoError(t, err)
	collect := func() int64 {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(t.Context(), &rm))
		return counter(rm, "tollgate.metadata.malformed")
	}
	require.Equal(t, int64(1), collect(), "GetAttempt counts the untrusted peer's malformed header")

	_, err = client.FenceAttempt(bad, &tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: "/x.Y/Z", FenceThroughTry: 1})
	require.NoError(t, err)
	require.Equal(t, int64(2), collect(), "FenceAttempt from an untrusted peer with a malformed header is not counted")
}

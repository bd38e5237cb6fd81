package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/metadata"
)

// TestRegression13MalformedHeaderRefusedAtTheTapIsNotCounted: DESIGN.md §2.1 says a
// malformed tollgate header, trusted peer or not, "is counted in a metric"
// (tollgate.metadata.malformed). The admission tap parses a trusted peer's
// header and, when it is malformed, silently drops it; when the class is
// full the tap then refuses the request (CONCURRENCY_FULL) and the
// interceptor, the only place that counts malformed headers, never runs. So
// under overload — when operators look — malformed headers go uncounted
// (and the trusted peer gets a repeatable RESOURCE_EXHAUSTED instead of the
// final INVALID_ARGUMENT MALFORMED_HEADER).
func TestRegression13MalformedHeaderRefusedAtTheTapIsNotCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })

	entered, release := make(chan struct{}), make(chan struct{})
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if r.GetKey() == "hold" {
			close(entered)
			<-release
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithServerMeterProvider(mp))...)
	client := testingv1.NewTestServiceClient(end.DialT(t)) // a plain client: the header is the test's

	held := make(chan error, 1)
	go func() {
		_, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "hold"})
		held <- err
	}()
	<-entered // the one slot is taken

	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x y")
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	close(release)
	require.NoError(t, <-held)
	require.Error(t, err)
	t.Logf("the trusted peer's malformed request was answered: %v (reason %v)", err, status.OutcomeOf(err).Reason)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	require.Equal(t, int64(1), counter(rm, "tollgate.metadata.malformed"),
		"a trusted peer's malformed header refused at the tap is not counted")
}

package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc/metadata"
)

// WithClassifier routes "critical" requests to their own idle class, but the
// tap ServerOptions installs by default classifies by method alone and
// refuses them while the method's class is full.
func TestRegressionTapIgnoresClassifier(t *testing.T) {
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "bulk", Slots: 1}, admission.Class{Name: "critical", Slots: 1}),
		admission.WithDefaultClass("bulk"),
		admission.WithClassifier(func(ctx context.Context, r admission.Request) string {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("crit")) > 0 {
				return "critical"
			}
			return ""
		}),
	)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	hold, release := make(chan struct{}), make(chan struct{})
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if r.GetKey() == "hold" {
			close(hold)
			<-release
		}
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	done := make(chan error, 1)
	go func() { _, err := client.Get(t.Context(), &testingv1.GetRequest{Key: "hold"}); done <- err }()
	<-hold
	defer func() { close(release); <-done }()
	_, err = client.Get(metadata.AppendToOutgoingContext(t.Context(), "crit", "1"), &testingv1.GetRequest{})
	require.NoError(t, err, "the critical class is idle")
}

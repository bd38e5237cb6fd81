package interceptor_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// The server keeps records and its only slot is held. A trusted peer's try
// whose attempt deadline has passed is let through by the interceptor's tap
// (its record, not admission, answers it), but only after the tap asked
// Controller.TapHandle, which already counted a CONCURRENCY_FULL refusal —
// in Stats, in tollgate.admission.decisions and in the degradation window —
// for a request that was never refused with that reason: the caller gets
// the store's answer (DEADLINE_EXPIRED here), and admission is not even
// consulted by the interceptor for it.
func TestRegression14TapLetThroughLateTryIsNotCountedAsRefused(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	store := memoryStore(t)
	hold, release := make(chan struct{}), make(chan struct{})
	svc := &testsvc.Service{
		ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			if r.GetKey() == "hold" {
				close(hold)
				<-release
			}
			return &testingv1.ApplyResponse{}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))

	held := make(chan error, 1)
	go func() {
		_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "hold"})
		held <- err
	}()
	<-hold
	defer func() { close(release); require.NoError(t, <-held) }()

	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	d := time.Now().Add(-time.Second) // the attempt's deadline has passed
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
		"a="+a.ID+";d="+strconv.FormatInt(d.UnixMilli(), 10)+";c=late;t=2")
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "late"})
	o := status.OutcomeOf(err)
	require.NotEqual(t, status.ReasonConcurrencyFull, o.Reason, "the late try is answered past the tap: %v", err)

	s, _ := ctrl.Stats().Class("work")
	require.Zero(t, s.Refused["CONCURRENCY_FULL"],
		"the caller was answered %s by the store, never refused CONCURRENCY_FULL, yet admission counted it (refused %v)",
		status.ReasonName(o.Reason), s.Refused)
}

package interceptor_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// DESIGN.md §2.3: tollgate-spent is sent "when > 0, or when the request
// carried r=1", and server.begin refuses a late try "with the inbound, so the
// refusal still reports tollgate-spent to a strict caller". Since af67236 the
// admission tap decides a trusted peer's late try first: on a server without
// a store it refuses DEADLINE_EXPIRED itself, where no trailer can be set,
// although admission had room and the interceptor would have answered with
// tollgate-spent: 0. A strict caller (which counts a completed call without
// the trailer as spent until reconciled, and has no store to reconcile with)
// now holds the grant it lent to a try that provably ran nothing.
func TestRegression14bTapLateTryLosesStrictSpentTrailer(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	svc := &testsvc.Service{}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) },
		serverOpts(interceptor.WithAdmission(ctrl))...) // no store
	client := testingv1.NewTestServiceClient(end.DialT(t))

	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	d := time.Now().Add(-time.Second) // the attempt's deadline has passed
	ctx := metadata.AppendToOutgoingContext(context.Background(), "tollgate",
		"a="+a.ID+";d="+strconv.FormatInt(d.UnixMilli(), 10)+";c=0;t=1;u=3;r=1")
	var trailer metadata.MD
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "late"}, grpc.Trailer(&trailer))
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
	require.Equal(t, []string{"0"}, trailer.Get("tollgate-spent"),
		"a strict (r=1) late try refused DEADLINE_EXPIRED must report tollgate-spent 0; trailer %v", trailer)
}

package interceptor_test

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// consumer serves Consume (a server-streaming method with side effects:
// every call keeps a record) with two messages.
type r18Consumer struct{ testsvc.Service }

func (*r18Consumer) Consume(_ *testingv1.ConsumeRequest, st grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
	for range 2 {
		if err := st.Send(&testingv1.ConsumeResponse{}); err != nil {
			return err
		}
	}
	return nil
}

// A stream's finished record answers a later try of its call COMMITTED
// (FAILED_PRECONDITION, RESPONSE_NOT_RETAINED): it cannot replay the
// messages. That try ran nothing and spent nothing, and the callee sends no
// tollgate-spent for 0 with a definite code; a lenient caller must give the
// grant back, as DESIGN §2.3 says of a definite code and as it does for a
// refusal naming the try. Before, it held the whole grant for the rest of
// the attempt (a user's keyed Consume, made twice, left Held 4 of 4).
func TestR18CommittedAnswerNamingTheTryRefundsALenientGrant(t *testing.T) {
	store := noSkewStore(t)
	svc := &r18Consumer{}
	e := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, svc) },
		interceptor.ServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0),
			interceptor.WithTrustedPeer(interceptor.TrustAll))...)
	client := testingv1.NewTestServiceClient(e.DialT(t, interceptor.DialOptions(interceptor.WithoutRetryBudget())...))

	ctx, err := interceptor.StartAttempt(t.Context(), 4, 4*time.Second)
	require.NoError(t, err)
	ctx = interceptor.WithCallKey(ctx, "take")
	drain := func() error {
		st, err := client.Consume(ctx, &testingv1.ConsumeRequest{Key: "k", Count: 2})
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}
	require.NoError(t, drain())
	ledger, ok := budget.FromContext(ctx)
	require.True(t, ok)
	require.Equal(t, int64(4), ledger.Snapshot().Free, "the first run spent nothing below")

	err = drain()
	require.Equal(t, codes.FailedPrecondition, grpcstatus.Code(err), "%v", err)
	require.Equal(t, status.KindCommitted, status.OutcomeOf(err).Kind)
	snap := ledger.Snapshot()
	require.Zero(t, snap.Held, "the replayed try's grant is held: %+v", snap)
	require.Equal(t, int64(4), snap.Free, "%+v", snap)
}

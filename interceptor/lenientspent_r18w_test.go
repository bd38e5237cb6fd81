package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// TestLenientGrantComesBackAfterUnknownAnswer: a tollgate server that
// answers a trusted tollgate caller with a code that is not definite
// (INTERNAL: UNKNOWN), having spent nothing below, reports tollgate-spent 0,
// so that a lenient caller's grant comes back at once rather than staying
// held until reconciled (its callee keeps no records here: never). Unary and
// stream calls alike. A success and a definite error carry no
// tollgate-spent: the caller settles those without it (DESIGN §2.3).
func TestLenientGrantComesBackAfterUnknownAnswer(t *testing.T) {
	svc := &testsvc.Service{
		ApplyFunc: func(_ context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			switch r.GetKey() {
			case "ok":
				return &testingv1.ApplyResponse{}, nil
			case "missing":
				return nil, grpcstatus.Error(codes.NotFound, "no such account")
			}
			return nil, grpcstatus.Error(codes.Internal, "boom")
		},
		UploadFunc: func(grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			return grpcstatus.Error(codes.Internal, "boom")
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	t.Run("unary", func(t *testing.T) {
		ctx, a := sixUnitAttempt(t)
		var trailer metadata.MD
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "fail"}, grpc.Trailer(&trailer))
		requireSettledUnknown(t, err, trailer, a)
	})
	t.Run("stream", func(t *testing.T) {
		ctx, a := sixUnitAttempt(t)
		st, err := client.Upload(ctx)
		require.NoError(t, err)
		_, err = st.CloseAndRecv()
		requireSettledUnknown(t, err, st.Trailer(), a)
	})
	for _, key := range []string{"ok", "missing"} {
		t.Run("none/"+key, func(t *testing.T) {
			ctx, a := sixUnitAttempt(t)
			var trailer metadata.MD
			_, _ = client.Apply(ctx, &testingv1.ApplyRequest{Key: key}, grpc.Trailer(&trailer))
			require.Empty(t, trailer.Get("tollgate-spent"))
			require.Equal(t, int64(6), a.Snapshot().Free, "settled without it")
		})
	}
}

// sixUnitAttempt starts an attempt of 6 units and 10 s, and returns its
// context and ledger.
func sixUnitAttempt(t *testing.T) (context.Context, *budget.Allowance) {
	t.Helper()
	ctx, err := interceptor.StartAttempt(t.Context(), 6, 10*time.Second)
	require.NoError(t, err)
	a, ok := budget.FromContext(ctx)
	require.True(t, ok)
	return ctx, a
}

// requireSettledUnknown requires that err, an origin's call made under
// sixUnitAttempt's ledger a, ended UNKNOWN with trailer tollgate-spent 0,
// and that the grant came back: nothing held, all 6 units free.
func requireSettledUnknown(t *testing.T, err error, trailer metadata.MD, a *budget.Allowance) {
	t.Helper()
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	require.Equal(t, []string{"0"}, trailer.Get("tollgate-spent"))
	snap := a.Snapshot()
	require.Zero(t, snap.Held, "%+v", snap)
	require.Equal(t, int64(6), snap.Free, "%+v", snap)
}

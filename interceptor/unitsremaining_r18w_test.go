package interceptor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// localRefusals are calls a client refuses itself, each made with ctx by a
// handler (or a caller) whose ledger has free units: the reason expected and
// the call.
var localRefusals = []struct {
	name   string
	reason status.Reason
	call   func(ctx context.Context, c testingv1.TestServiceClient) error
}{
	{"deadline-unreachable", status.ReasonDeadlineUnreachable, func(ctx context.Context, c testingv1.TestServiceClient) error {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Millisecond) // under the minimum try time
		defer cancel()
		_, err := c.Apply(interceptor.WithCallKey(ctx, "short"), &testingv1.ApplyRequest{})
		return err
	}},
	{"call-key-required", status.ReasonCallKeyRequired, func(ctx context.Context, c testingv1.TestServiceClient) error {
		_, err := c.Apply(ctx, &testingv1.ApplyRequest{}) // unkeyed, in an IDEMPOTENT handler
		return err
	}},
	{"malformed-header", status.ReasonMalformedHeader, func(ctx context.Context, c testingv1.TestServiceClient) error {
		_, err := c.Apply(interceptor.WithCallKey(ctx, strings.Repeat("x", 130)), &testingv1.ApplyRequest{})
		return err
	}},
	{"not-sent", status.ReasonNotSent, func(ctx context.Context, c testingv1.TestServiceClient) error {
		ctx, cancel := context.WithCancel(ctx)
		cancel() // the try never leaves the client
		_, err := c.Apply(interceptor.WithCallKey(ctx, "cancelled"), &testingv1.ApplyRequest{})
		return err
	}},
}

// TestLocalRefusalsReportFreeUnits: DESIGN §2.4's units_remaining — a
// refusal the client builds itself carries the free units of the attempt's
// ledger at this tier, as ALLOWANCE_EXHAUSTED does, not 0: in a mid-tier
// handler (its grant) and at an origin (StartAttempt's allowance), unary and
// stream calls alike.
func TestLocalRefusalsReportFreeUnits(t *testing.T) {
	leaf := &testsvc.Service{
		ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			return &testingv1.ApplyResponse{}, nil
		},
		UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			return st.SendAndClose(&testingv1.UploadResponse{})
		},
	}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	leafClient := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))

	for _, tc := range localRefusals {
		t.Run("mid/"+tc.name, func(t *testing.T) {
			var (
				err  error
				free int64
			)
			mid := &testsvc.Service{PutFunc: func(ctx context.Context, _ *testingv1.PutRequest) (*testingv1.PutResponse, error) {
				a, _ := budget.FromContext(ctx)
				free = a.Free()
				err = tc.call(ctx, leafClient)
				return &testingv1.PutResponse{}, nil
			}}
			midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
			origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(interceptor.WithAllowance(6))...))
			_, callErr := origin.Put(t.Context(), &testingv1.PutRequest{})
			require.NoError(t, callErr)
			requireUnits(t, err, tc.reason, free)
		})
		if tc.reason == status.ReasonCallKeyRequired {
			continue // only a handler of an IDEMPOTENT method is refused so
		}
		t.Run("origin/"+tc.name, func(t *testing.T) {
			ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
			require.NoError(t, err)
			err = tc.call(ctx, leafClient)
			requireUnits(t, err, tc.reason, 4)
		})
	}

	// A stream refused so says the same.
	t.Run("mid/stream/deadline-unreachable", func(t *testing.T) {
		var (
			err  error
			free int64
		)
		mid := &testsvc.Service{PutFunc: func(ctx context.Context, _ *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			a, _ := budget.FromContext(ctx)
			free = a.Free()
			sctx, cancel := context.WithTimeout(interceptor.WithCallKey(ctx, "upload"), 3*time.Millisecond)
			defer cancel()
			var st grpc.ClientStreamingClient[testingv1.UploadRequest, testingv1.UploadResponse]
			st, err = leafClient.Upload(sctx)
			if err == nil {
				_, err = st.CloseAndRecv()
			}
			return &testingv1.PutResponse{}, nil
		}}
		midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
		origin := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(interceptor.WithAllowance(6))...))
		_, callErr := origin.Put(t.Context(), &testingv1.PutRequest{})
		require.NoError(t, callErr)
		requireUnits(t, err, status.ReasonDeadlineUnreachable, free)
	})
}

// requireUnits checks that err is a NOT_ADMITTED refusal for reason whose
// detail reports free units remaining (free > 0, so that 0 cannot pass).
func requireUnits(t *testing.T, err error, reason status.Reason, free int64) {
	t.Helper()
	require.Positive(t, free)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, reason, o.Reason, "%v", err)
	require.Equal(t, free, o.Detail.GetUnitsRemaining(), "%v", err)
}

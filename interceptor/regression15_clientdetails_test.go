package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found that a server's error of a code that is not definite
// (ABORTED here; the same for UNAVAILABLE, RESOURCE_EXHAUSTED, INTERNAL, ...) becomes an UNKNOWN
// outcome on a tollgate client (DESIGN.md §2.5) and keeps its code, but
// status.OutcomeUnknown built the status callers read with
// grpc/status.FromError (and status.Convert) from tollgate's own details
// only: the server's google.rpc details (an ErrorInfo naming the
// conflict, a QuotaFailure, a BadRequest...) were gone, and
// FromError stops at tollgate's error, so the wrapped cause is out of reach
// of the grpc API. With grpc-go alone, FromError(err).Details() has them;
// they now follow tollgate's own (but an ErrorInfo, of which a status
// carries one, tollgate's, and a RetryInfo).
func TestRegression15ClientServerDetailsKept(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		st, err := grpcstatus.New(codes.Aborted, "version conflict").WithDetails(&errdetails.PreconditionFailure{
			Violations: []*errdetails.PreconditionFailure_Violation{{Type: "VERSION", Subject: "ledger.example.com/k"}},
		})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}}
	// A callee that does not speak tollgate (the README: such a callee's
	// error is typed UNKNOWN on the client): tollgate's server interceptor,
	// which rewrites a handler's ABORTED the same way, is left out.
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)

	hasConflict := func(err error) bool {
		st, _ := grpcstatus.FromError(err)
		for _, d := range st.Details() {
			if pf, ok := d.(*errdetails.PreconditionFailure); ok && len(pf.GetViolations()) == 1 &&
				pf.GetViolations()[0].GetSubject() == "ledger.example.com/k" {
				return true
			}
		}
		return false
	}
	plain := testingv1.NewTestServiceClient(end.DialT(t))
	_, err := plain.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	require.True(t, hasConflict(err), "grpc-go alone: %v", err)

	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	require.Equal(t, codes.Aborted, grpcstatus.Code(err), "the code is kept: %v", err)
	require.True(t, hasConflict(err), "the server's PreconditionFailure is lost from status.FromError(err).Details(): %v", err)
}

package status_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

func TestWithNamesTheCallAndKeepsTheRest(t *testing.T) {
	orig := status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second), status.WithClass("heavy"))
	err := status.With(orig, status.WithAttempt("a1", "0.1.2", 2), status.WithMessage("more"))

	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonQueueFull, o.Reason)
	require.Equal(t, codes.ResourceExhausted, o.Code)
	require.Equal(t, "a1", o.Detail.GetAttemptId())
	require.Equal(t, "0.1.2", o.Detail.GetCall())
	require.Equal(t, uint32(2), o.Detail.GetTry())
	require.Equal(t, "heavy", o.Detail.GetWorkloadClass())
	ra, ok := status.RetryAfter(err)
	require.True(t, ok)
	require.Equal(t, time.Second, ra)
	require.Equal(t, "tollgate: not admitted: queue full: more", grpcstatus.Convert(err).Message())

	// The original is unchanged.
	require.Empty(t, status.OutcomeOf(orig).Detail.GetAttemptId())
	// Errors without a tollgate *Error pass through.
	plain := grpcstatus.Error(codes.NotFound, "x")
	require.Same(t, plain, status.With(plain, status.WithAttempt("a", "0", 1)))
}

package status_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// With keeps a WithoutEffect so that HandlerOutcome reads its copy as it
// reads err (its doc). It must not make NOT_ADMITTED of an error whose
// status is decided by something else than the *Error it copies: there the
// WithoutEffect encloses a status from below (an INTERNAL a callee sent),
// which HandlerOutcome reads UNKNOWN, and the handler declared nothing of
// the refusal that happens to lie deeper in the chain.
func TestWithKeepsWithoutEffectOnlyOfTheDecidingError_r18y(t *testing.T) {
	na := status.NotAdmitted(status.ReasonQueueFull)
	fromBelow := grpcstatus.Error(codes.Internal, "callee failed")

	for name, err := range map[string]error{
		// errors.Join: the first status-bearing branch decides (grpc-go's
		// status.FromError), errors.As finds the *Error in the second.
		"join": status.WithoutEffect(errors.Join(fromBelow, na)),
		// A status error type of the user's that keeps its cause.
		"cause": status.WithoutEffect(&causedStatus{st: grpcstatus.New(codes.Internal, "wrapped"), cause: na}),
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, status.KindUnknown, status.HandlerOutcome(err, false).Kind, "the premise")
			got := status.With(err, status.WithAttempt("a", "0", 1))
			require.NotEqual(t, status.KindNotAdmitted, status.HandlerOutcome(got, false).Kind,
				"With turned an error HandlerOutcome reads UNKNOWN into a refusal without effect")
		})
	}

	// What With must keep still holds.
	kept := status.With(fmt.Errorf("reserve: %w", status.WithoutEffect(na)), status.WithAttempt("a", "0", 1))
	require.Equal(t, status.KindNotAdmitted, status.HandlerOutcome(kept, false).Kind)
}

type causedStatus struct {
	st    *grpcstatus.Status
	cause error
}

func (e *causedStatus) Error() string                  { return e.st.Message() }
func (e *causedStatus) GRPCStatus() *grpcstatus.Status { return e.st }
func (e *causedStatus) Unwrap() error                  { return e.cause }

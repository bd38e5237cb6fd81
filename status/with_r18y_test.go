package status_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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

// With's copy says what grpc-go sends for err (its doc): err.Error() when a
// wrapper without a status of its own encloses the *Error, but the status's
// own message when err has a GRPCStatus method, as admission's refusal of a
// wait its context ended has (its Error() appends the context's error, its
// status is the refusal's). The server re-addresses that refusal with With:
// the wire message must not change. And a WithoutEffect around such an
// error reads NOT_ADMITTED, so its copy must too.
func TestWithSaysWhatGRPCSendsForAStatusBearingWrapper_r18y(t *testing.T) {
	na := status.NotAdmitted(status.ReasonDeadlineExpired, status.WithRetryAfter(time.Second))
	ended := &refusalEnded{refusal: na, cause: context.DeadlineExceeded}
	for name, err := range map[string]error{
		"own status":           ended,
		"wrapped own status":   fmt.Errorf("admit: %w", ended),
		"without effect":       status.WithoutEffect(ended),
		"plain wrapper":        fmt.Errorf("reserve: %w", na),
		"without effect, text": status.WithoutEffect(fmt.Errorf("reserve: %w", na)),
	} {
		t.Run(name, func(t *testing.T) {
			got := status.With(err, status.WithAttempt("a", "0", 1))
			require.Equal(t, grpcstatus.Convert(err).Message(), grpcstatus.Convert(got).Message())
			require.Equal(t, status.HandlerOutcome(err, false).Kind, status.HandlerOutcome(got, false).Kind)
		})
	}
}

// refusalEnded is shaped as admission's waitEndedError.
type refusalEnded struct{ refusal, cause error }

func (e *refusalEnded) Error() string   { return e.refusal.Error() + ": " + e.cause.Error() }
func (e *refusalEnded) Unwrap() []error { return []error{e.refusal, e.cause} }
func (e *refusalEnded) GRPCStatus() *grpcstatus.Status {
	st, _ := grpcstatus.FromError(e.refusal)
	return st
}

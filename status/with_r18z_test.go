package status_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// With keeps the outcome of err (its doc): the copy crosses gRPC with the
// code and the tollgate detail (but for what the options name) that err
// would cross with, and the classifiers read it as they read err. When
// another error decides err's status (the first branch of an errors.Join,
// a status type that keeps the *Error as its cause), that error's status is
// what grpc-go sends for err: With must not replace it with the *Error it
// found deeper in the chain. Nor past the depth the classifiers read
// (a chain errors.As walks further than they do).
func TestWithKeepsTheStatusErrWouldSendR18z(t *testing.T) {
	na := status.NotAdmitted(status.ReasonQueueFull)
	na2 := status.NotAdmitted(status.ReasonDraining)
	fromBelow := grpcstatus.Error(codes.Internal, "callee failed")
	long := strings.Repeat("x", 4<<10)

	for name, err := range map[string]error{
		"join, status first":          errors.Join(fromBelow, na),
		"without effect, join":        status.WithoutEffect(errors.Join(fromBelow, na)),
		"status type with cause":      &causedStatus{st: grpcstatus.New(codes.Internal, "wrapped"), cause: na},
		"without effect, status type": status.WithoutEffect(&causedStatus{st: grpcstatus.New(codes.Internal, "wrapped"), cause: na}),
		"join of two refusals":        errors.Join(na, na2),
		"without effect, two":         status.WithoutEffect(errors.Join(na, na2)),
		"plain wrapper":               fmt.Errorf("reserve: %w", na),
		"long wrapper":                fmt.Errorf("%s: %w", long, status.WithoutEffect(na)),
		"invalid UTF-8 wrapper":       fmt.Errorf("re\xffserve: %w", status.WithoutEffect(na)),
		"deep chain":                  deep(status.WithoutEffect(na), 500),
	} {
		t.Run(name, func(t *testing.T) {
			got := status.With(err, status.WithAttempt("a", "0", 1))
			want, have := grpcstatus.Convert(err), grpcstatus.Convert(got)
			require.Equal(t, want.Code(), have.Code(), "With changed the code grpc-go sends")
			for _, noSideEffects := range []bool{false, true} {
				require.Equal(t, status.HandlerOutcome(err, noSideEffects).Kind, status.HandlerOutcome(got, noSideEffects).Kind)
			}
			wo, gotO := status.OutcomeOf(err), status.OutcomeOf(got)
			require.Equal(t, wo.Kind, gotO.Kind, "With changed OutcomeOf")
			require.Equal(t, wo.Reason, gotO.Reason)
			if wo.Detail == nil {
				require.Nil(t, gotO.Detail, "With added a tollgate detail err does not send")
			} else {
				require.Equal(t, wo.Detail.GetOutcome(), gotO.Detail.GetOutcome())
				require.Equal(t, wo.Detail.GetFinal(), gotO.Detail.GetFinal())
			}
			require.LessOrEqual(t, len(have.Message()), 3<<10)
		})
	}
}

func deep(err error, n int) error {
	for i := 0; i < n; i++ {
		err = fmt.Errorf("l%d: %w", i, err)
	}
	return err
}

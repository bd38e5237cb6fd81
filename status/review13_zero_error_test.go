package status_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/codes"
)

// TestZeroAndNilErrorReadAsSent: the zero Error crosses gRPC as UNKNOWN, and
// its Code, and the Code OutcomeOf reads from it, say so; a nil *Error (a
// typed nil found with errors.As) answers its accessors as Error and
// GRPCStatus do, without panicking. Review r13 found Code() and OutcomeOf's
// Code reporting OK for the zero Error, which GRPCStatus sends as UNKNOWN
// (Code's doc: "the gRPC code the error is sent with"), and Code, Reason and
// Detail panicking on a nil *Error while Error, Unwrap and GRPCStatus do not.
func TestZeroAndNilErrorReadAsSent(t *testing.T) {
	zero := &status.Error{}
	require.Equal(t, zero.GRPCStatus().Code(), zero.Code())
	require.Equal(t, codes.Unknown, status.OutcomeOf(zero).Code)
	require.Equal(t, codes.Unknown, status.OutcomeOf(fmt.Errorf("wrapped: %w", zero)).Code)
	require.Equal(t, status.KindUnknown, status.OutcomeOf(zero).Kind)

	var typedNil *status.Error
	var te *status.Error
	require.True(t, errors.As(fmt.Errorf("x: %w", typedNil), &te))
	require.NotPanics(t, func() {
		require.Equal(t, codes.Unknown, te.Code())
		require.Equal(t, status.ReasonUnspecified, te.Reason())
		require.Nil(t, te.Detail())
	})
}

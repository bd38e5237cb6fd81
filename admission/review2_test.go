package admission_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// A review found that Capacity summed its classes' Slots and QueueItems
// in an int that wraps: a class configured with math.MaxInt slots (no
// bound in practice) made it negative, or, with two such classes, a small
// positive number, which tollgate's interceptor then took for the streams
// admission holds (and accepted a per-connection stream bound far below
// them). It saturates at math.MaxInt instead.
func TestCapacitySaturates(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(
		admission.Class{Name: "a", Slots: math.MaxInt, QueueItems: math.MaxInt},
		admission.Class{Name: "b", Slots: math.MaxInt, QueueItems: 1},
	), admission.WithDefaultClass("a"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	require.Equal(t, math.MaxInt, ctrl.Capacity())

	one, err := admission.New(admission.WithClasses(admission.Class{Name: "a", Slots: math.MaxInt}), admission.WithDefaultClass("a"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = one.Close() })
	require.Equal(t, math.MaxInt, one.Capacity(), "MaxInt slots and the control class's 2+8")
}

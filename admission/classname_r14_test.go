package admission_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/admission"
)

// A review found that tollgate's bound on what a server sends drops a class
// name longer than 256 bytes from a refusal's detail, while New accepted
// any length: an operator's long class name would silently vanish from
// every refusal. New now refuses it, saying why.
func TestClassNameLongerThanARefusalCarriesIsRefused(t *testing.T) {
	_, err := admission.New(admission.WithClasses(admission.Class{Name: strings.Repeat("c", admission.MaxClassNameBytes+1), Slots: 1}))
	require.Error(t, err)
	require.ErrorContains(t, err, "at most 256")

	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: strings.Repeat("c", admission.MaxClassNameBytes), Slots: 1}))
	require.NoError(t, err)
	require.NoError(t, ctrl.Close())
}

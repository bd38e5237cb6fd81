package admission_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// A review found that New accepted a control class that lends its slots or
// is optional (data traffic could borrow the control path's slots, or shed
// it), and patterns that can never match: a "*" before the end, or a name
// that is neither a service nor a full method ("/pkg.Svc"). Each is now
// refused; the pattern forms WithMethods documents are still accepted.
func TestRegression14NewRefusesDeadPatternsAndALendingControlClass(t *testing.T) {
	cls := admission.WithClasses(admission.Class{Name: "a", Slots: 1})
	for name, opts := range map[string][]admission.Option{
		"lending control class":  {cls, admission.WithClasses(admission.Class{Name: admission.ControlClass, Slots: 2, LendIdle: true})},
		"optional control class": {cls, admission.WithClasses(admission.Class{Name: admission.ControlClass, Slots: 2, Optional: true})},
		"star inside":            {cls, admission.WithMethods("a", "/pkg.*/Do")},
		"service without slash":  {cls, admission.WithMethods("a", "/pkg.Svc")},
		"too many parts":         {cls, admission.WithMethods("a", "/pkg.Svc/Do/x")},
		"empty method":           {cls, admission.WithMethods("a", "/pkg.Svc//")},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := admission.New(opts...)
			if c != nil {
				_ = c.Close()
			}
			require.ErrorIs(t, err, admission.ErrInvalidConfig)
		})
	}
	for _, pat := range []string{"/pkg.Svc/Do", "/pkg.Svc/", "/pkg.*", "/*"} {
		c, err := admission.New(cls, admission.WithMethods("a", pat))
		require.NoError(t, err, pat)
		_ = c.Close()
	}
}

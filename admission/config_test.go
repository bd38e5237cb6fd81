package admission_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// Configurations that cannot mean anything are accepted silently:
//   - MaxRefusalRatio NaN passes fill's "> 1" check (false for NaN) and then
//     fails rollWindows' ">= 0" test, so the refusal-ratio signal is off
//     without anyone asking (negative is the documented "off");
//   - the same pattern routed to two classes: the later silently wins
//     (c.exact/c.services are maps), no precedence rule covers it;
//   - a pattern routing a control method to a data class: classify checks
//     the control methods first, so the pattern is silently dead.
//
// Each should be refused with ErrInvalidConfig and a message naming it.
func TestNewRefusesMeaninglessConfig(t *testing.T) {
	cls := admission.WithClasses(admission.Class{Name: "a", Slots: 1}, admission.Class{Name: "b", Slots: 1})
	tests := []struct {
		name string
		opts []admission.Option
	}{
		{"ratio NaN", []admission.Option{admission.WithDegradation(admission.Degradation{MaxRefusalRatio: math.NaN()})}},
		{"pattern to two classes", []admission.Option{cls, admission.WithMethods("a", "/x.S/"), admission.WithMethods("b", "/x.S/")}},
		{"control method to a data class", []admission.Option{cls, admission.WithMethods("b", "/grpc.health.v1.Health/")}},
		// A retry-after bound of nothing cannot be honoured by a jittered
		// suggestion (TestRetryAfterIsBounded).
		{"max retry-after 0", []admission.Option{admission.WithMaxRetryAfter(0)}},
		{"max retry-after below a millisecond", []admission.Option{admission.WithMaxRetryAfter(time.Microsecond)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := admission.New(tt.opts...)
			if c != nil {
				_ = c.Close()
			}
			require.ErrorIs(t, err, admission.ErrInvalidConfig)
		})
	}
}

// A review found that New accepted a control class that lends its slots or
// is optional (data traffic could borrow the control path's slots, or shed
// it), and patterns that can never match: a "*" before the end, or a name
// that is neither a service nor a full method ("/pkg.Svc"). Each is now
// refused; the pattern forms WithMethods documents are still accepted.
func TestNewRefusesDeadPatternsAndALendingControlClass(t *testing.T) {
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

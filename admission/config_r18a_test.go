package admission_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// A service owner found that New accepted, without error, options that are
// no-ops or likely mistakes: a per-tenant queue bound on a class that has no
// queue, WithMethods without a pattern, WithStages with bits the package
// does not define, nil meter and tracer providers (which tollgate's
// interceptor refuses), and all unclassified data traffic sent into the
// control class. Each is now ErrInvalidConfig.
func TestR18aNewRefusesNoOpsAndMistakes(t *testing.T) {
	ok := admission.Class{Name: "a", Slots: 1}
	for name, opts := range map[string][]admission.Option{
		"TenantQueued without a queue": {admission.WithClasses(admission.Class{Name: "a", Slots: 1, TenantQueued: 5})},
		"WithMethods without patterns": {admission.WithClasses(ok), admission.WithMethods("a")},
		"WithStages with unknown bits": {admission.WithClasses(ok), admission.WithStages(admission.Stage(0x80))},
		"WithStages with some unknown": {admission.WithClasses(ok), admission.WithStages(admission.StageSize | admission.Stage(0x40))},
		"nil meter provider":           {admission.WithClasses(ok), admission.WithMeterProvider(nil)},
		"nil tracer provider":          {admission.WithClasses(ok), admission.WithTracerProvider(nil)},
		"default class control":        {admission.WithClasses(ok), admission.WithDefaultClass(admission.ControlClass)},
		"default class control, own": {admission.WithClasses(ok, admission.Class{Name: admission.ControlClass, Slots: 2}),
			admission.WithDefaultClass(admission.ControlClass)},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := admission.New(opts...)
			if err == nil {
				_ = c.Close()
			}
			require.ErrorIs(t, err, admission.ErrInvalidConfig)
		})
	}
}

// The legitimate neighbours of those mistakes are still accepted.
func TestR18aNewKeepsTheLegitimateNeighbours(t *testing.T) {
	ok := admission.Class{Name: "a", Slots: 1}
	for name, opts := range map[string][]admission.Option{
		"TenantRunning above Slots (borrowing)": {admission.WithClasses(admission.Class{Name: "a", Slots: 1, TenantRunning: 5})},
		"TenantQueued with a queue":             {admission.WithClasses(admission.Class{Name: "a", Slots: 1, QueueItems: 2, TenantQueued: 1})},
		"an operator method in control":         {admission.WithClasses(ok), admission.WithMethods(admission.ControlClass, "/ops.Deploy/Cancel")},
		"no switchable stage":                   {admission.WithClasses(ok), admission.WithStages(0)},
		"every stage":                           {admission.WithClasses(ok), admission.WithStages(admission.AllStages)},
		"nil option":                            {admission.WithClasses(ok), nil},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := admission.New(opts...)
			require.NoError(t, err)
			require.NoError(t, c.Close())
		})
	}
}

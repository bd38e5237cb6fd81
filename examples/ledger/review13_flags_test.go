package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOutOfRangeFlagsAreErrors: values the interceptor's options refuse
// (an allowance above the header's 1,000,000 units, an attempt timeout or a
// backoff over 24 h, a clock skew over 1 min) are a clear error from run, before any scenario runs.
// Review r13 found that run checked only their sign and then panicked in
// interceptor.DialOptions with a stack trace.
func TestOutOfRangeFlagsAreErrors(t *testing.T) {
	for name, edit := range map[string]func(*config){
		"allowance":       func(c *config) { c.Allowance = 2_000_000 },
		"attempt timeout": func(c *config) { c.AttemptTimeout = 25 * time.Hour },
		"backoff":         func(c *config) { c.MaxBackoff = 25 * time.Hour },
		"clock skew":      func(c *config) { c.Skew = 2 * time.Minute },
	} {
		cfg := testConfig()
		edit(&cfg)
		var err error
		require.NotPanics(t, func() { _, err = run(t.Context(), cfg) }, name)
		require.ErrorContains(t, err, name, name)
	}
}

package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOutOfRangeFlagsAreErrors: values the interceptor's options refuse
// (an allowance above the header's 1,000,000 units, an attempt timeout or a
// backoff over 24 h) are a clear error from run, before anything runs. Review
// r13 found that run checked only their sign, ran the plain construction,
// and then panicked in interceptor.DialOptions with a stack trace.
func TestOutOfRangeFlagsAreErrors(t *testing.T) {
	for name, edit := range map[string]func(*config){
		"allowance":       func(c *config) { c.Allowance = 2_000_000 },
		"attempt timeout": func(c *config) { c.AttemptTimeout = 25 * time.Hour },
		"backoff":         func(c *config) { c.Backoff = 25 * time.Hour },
	} {
		cfg := defaults()
		edit(&cfg)
		var err error
		require.NotPanics(t, func() { _, err = run(t.Context(), cfg) }, name)
		require.ErrorContains(t, err, name, name)
	}
}

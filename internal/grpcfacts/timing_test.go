package grpcfacts_test

import "time"

// Bounds for require.Eventually: generous, so they never decide a result on
// a loaded machine; they only stop a test that would otherwise hang.
const (
	testTimeout = 10 * time.Second
	tick        = time.Millisecond
)

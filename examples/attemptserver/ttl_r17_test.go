package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The printed window to read the record is the shorter of the store's TTL
// and the server's -duration: the memory store dies with the process, so a
// server stopping after 2 minutes cannot promise 5 (a fresh-eyes review
// read "within 5m0s" from a 2-minute run).
func TestReadableForIsTheShorterOfTTLAndDuration(t *testing.T) {
	require.Equal(t, "for 2m0s, until the server stops (its memory store goes with it; the record's TTL is 5m0s)",
		readableFor(5*time.Minute, 2*time.Minute))
	require.Equal(t, "within 5m0s (the store's TTL)", readableFor(5*time.Minute, 5*time.Minute))
	require.Equal(t, "within 5m0s (the store's TTL)", readableFor(5*time.Minute, time.Hour))
	require.Equal(t, "within 5m0s (the store's TTL), while the server runs", readableFor(5*time.Minute, 0))
}

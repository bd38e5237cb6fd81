package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/internal/readmequote"
)

// TestReadmeQuotesThisOutput: the block README.md quotes under "Measured
// results" for `go run ./examples/relay` (no flags) is what the program
// prints with its defaults. Only the attempt ID differs from run to run.
func TestReadmeQuotesThisOutput(t *testing.T) {
	readme := readmequote.Block(t, "../../README.md", "`go run ./examples/relay` (client")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := run(ctx, defaults())
	require.NoError(t, err)
	var out bytes.Buffer
	report(&out, res)
	readmequote.Require(t, readme, out.String(), nil)
}

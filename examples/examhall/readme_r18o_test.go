package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/internal/readmequote"
)

// TestReadmeQuotesThisOutput: the block README.md quotes for `go run
// ./examples/examhall` (no flags) is what the program prints with its
// defaults, line for line: the clock is virtual, so nothing varies.
func TestReadmeQuotesThisOutput(t *testing.T) {
	readme := readmequote.Block(t, "../../README.md", "`go run ./examples/examhall` (seed 003")
	cfg := defaults()
	cfg.Timeout = 30 * time.Second // the flag's default, which the report prints
	rep, err := Run(cfg)
	require.NoError(t, err)
	var out bytes.Buffer
	Print(&out, rep)
	readmequote.Require(t, readme, out.String(), nil)
}

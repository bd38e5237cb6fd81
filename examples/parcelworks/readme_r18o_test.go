package main

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/internal/readmequote"
)

// TestReadmeQuotesThisOutput: the block README.md quotes for `go run
// ./examples/parcelworks` (no flags) is what the program prints with its
// defaults. Only the wall-clock numbers differ from run to run (the README
// says so): each probe's start delay, their max, and the elapsed time.
func TestReadmeQuotesThisOutput(t *testing.T) {
	readme := readmequote.Block(t, "../../README.md", "`go run ./examples/parcelworks` (seeds")
	cfg := defaults()
	cfg.Timeout = 30 * time.Second // the flag's default
	rep, err := Run(cfg)
	require.NoError(t, err)
	var out bytes.Buffer
	Print(&out, rep)
	readmequote.Require(t, readme, out.String(), []readmequote.Mask{
		// a time.Duration as printed, rounded to 100 ns: 6.2µs, 1.3ms, 1.0002s
		{Line: regexp.MustCompile(`^control probes while `), Re: regexp.MustCompile(`\b\d+(\.\d+)?(ns|µs|ms|s)\b`), Repl: "<delay>"},
		{Line: regexp.MustCompile(`^elapsed \d+\.\d ms$`), Re: regexp.MustCompile(`\d+\.\d`), Repl: "<ms>"},
	})
}

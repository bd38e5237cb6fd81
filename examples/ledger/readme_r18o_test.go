package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/internal/readmequote"
)

// TestReadmeQuotesThisOutput: the block README.md quotes for `go run
// ./examples/ledger` (no flags) is what the program prints with its
// defaults. What the README says differs from run to run is masked, and
// only that: the attempt IDs, restart-redis's count of queries and the
// total's, and the way restart-redis reaches UNKNOWN (the state its
// replacement's store last held, IN_PROGRESS or ABANDONED, and the reason
// the call gives, including a query that timed out). Without a Redis the
// program skips restart-redis: the other scenarios are compared, then the
// test skips (or fails, with TOLLGATE_REQUIRE_REDIS=1).
func TestReadmeQuotesThisOutput(t *testing.T) {
	readme := readmequote.Block(t, "../../README.md", "```console\n$ go run ./examples/ledger")
	require.Equal(t, "$ go run ./examples/ledger", readme[0], "the README runs it without flags")
	readme = readme[1:]

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := run(ctx, testConfig())
	require.NoError(t, err)
	var out bytes.Buffer
	report(&out, res)

	redis := regexp.MustCompile(`^restart-redis `)
	masks := []readmequote.Mask{
		{Section: redis, Line: redis, Re: regexp.MustCompile(`queries=\d+`), Repl: "queries=<n>"},
		{Line: regexp.MustCompile(`^total: `), Re: regexp.MustCompile(`queries=\d+`), Repl: "queries=<n>"},
		{Section: redis, Line: regexp.MustCompile(`^  the replacement server's store holds`), Re: regexp.MustCompile(`as (IN_PROGRESS|ABANDONED)$`), Repl: "as <state>"},
		{Section: redis, Line: regexp.MustCompile(`^  restart-redis: `), Re: regexp.MustCompile(`\([^()]*try's state.*\)( ledger-ran=)`), Repl: "(<how it ended>)$1"},
	}
	for _, s := range res.Scenarios {
		if s.Name != "restart-redis" || !s.Skipped {
			continue
		}
		// Compare what ran: the README's blocks and the program's, less
		// restart-redis's and the total line (which counts it).
		printed := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		readmequote.Require(t, withoutR18o(readme, "restart-redis "), strings.Join(withoutR18o(printed, "restart-redis "), "\n"), masks)
		requireRedis(t, s)
	}
	readmequote.Require(t, readme, out.String(), masks)
}

// withoutR18o drops the section whose heading begins with name, with the
// blank line after it, and the closing total line with the blank line
// before it.
func withoutR18o(lines []string, name string) []string {
	var kept []string
	skipping := false
	for _, l := range lines {
		if l != "" && !strings.HasPrefix(l, " ") {
			skipping = strings.HasPrefix(l, name)
		}
		if skipping || strings.HasPrefix(l, "total: ") {
			continue
		}
		kept = append(kept, l)
	}
	for len(kept) > 0 && kept[len(kept)-1] == "" {
		kept = kept[:len(kept)-1]
	}
	return kept
}

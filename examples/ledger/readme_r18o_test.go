package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	readme := quoteR18o(t, "```console\n$ go run ./examples/ledger")
	require.Equal(t, "$ go run ./examples/ledger", readme[0], "the README runs it without flags")
	readme = readme[1:]

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := run(ctx, testConfig())
	require.NoError(t, err)
	var out bytes.Buffer
	report(&out, res)

	redis := regexp.MustCompile(`^restart-redis `)
	masks := []maskR18o{
		{section: redis, line: redis, re: regexp.MustCompile(`queries=\d+`), repl: "queries=<n>"},
		{line: regexp.MustCompile(`^total: `), re: regexp.MustCompile(`queries=\d+`), repl: "queries=<n>"},
		{section: redis, line: regexp.MustCompile(`^  the replacement server's store holds`), re: regexp.MustCompile(`as (IN_PROGRESS|ABANDONED)$`), repl: "as <state>"},
		{section: redis, line: regexp.MustCompile(`^  restart-redis: `), re: regexp.MustCompile(`\([^()]*try's state.*\)( ledger-ran=)`), repl: "(<how it ended>)$1"},
	}
	for _, s := range res.Scenarios {
		if s.Name != "restart-redis" || !s.Skipped {
			continue
		}
		// Compare what ran: the README's blocks and the program's, less
		// restart-redis's and the total line (which counts it).
		printed := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		requireQuoteR18o(t, withoutR18o(readme, "restart-redis "), strings.Join(withoutR18o(printed, "restart-redis "), "\n"), masks)
		requireRedis(t, s)
	}
	requireQuoteR18o(t, readme, out.String(), masks)
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

// quoteR18o is README.md's quoted output block that begins at the first
// fence at or after marker, one string per line, without its fences.
func quoteR18o(t *testing.T, marker string) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	text := string(b)
	i := strings.Index(text, marker)
	require.GreaterOrEqual(t, i, 0, "README.md quotes %q", marker)
	open := strings.Index(text[i:], "```")
	require.GreaterOrEqual(t, open, 0, "a fenced block follows %q in README.md", marker)
	body := text[i+open:]
	body = body[strings.Index(body, "\n")+1:] // past the fence and its language
	end := strings.Index(body, "```")
	require.GreaterOrEqual(t, end, 0, "the block after %q ends", marker)
	return strings.Split(strings.TrimSuffix(body[:end], "\n"), "\n")
}

// maskR18o replaces, in one field of what a line says, a value that
// legitimately differs from run to run: re's matches, on lines matching
// line (any line if nil) within a section whose heading (the last line not
// indented) matches section (any if nil).
type maskR18o struct {
	section, line, re *regexp.Regexp
	repl              string
}

// attemptIDR18o is a UUIDv7. Each distinct ID in a block is numbered in the
// order it first appears, so where the same attempt is named twice the
// README and the program must both name one attempt.
var attemptIDR18o = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}`)

func maskedR18o(lines []string, masks []maskR18o) []string {
	ids := map[string]string{}
	out := make([]string, len(lines))
	heading := ""
	for i, l := range lines {
		if l != "" && !strings.HasPrefix(l, " ") {
			heading = l
		}
		l = attemptIDR18o.ReplaceAllStringFunc(l, func(id string) string {
			if _, ok := ids[id]; !ok {
				ids[id] = fmt.Sprintf("<attempt %d>", len(ids)+1)
			}
			return ids[id]
		})
		for _, m := range masks {
			if (m.section == nil || m.section.MatchString(heading)) && (m.line == nil || m.line.MatchString(l)) {
				l = m.re.ReplaceAllString(l, m.repl)
			}
		}
		out[i] = l
	}
	return out
}

// requireQuoteR18o compares README.md's quote with the program's output
// line by line after masking, and names every line that differs.
func requireQuoteR18o(t *testing.T, readme []string, output string, masks []maskR18o) {
	t.Helper()
	got := strings.Split(strings.TrimSuffix(output, "\n"), "\n")
	w, g := maskedR18o(readme, masks), maskedR18o(got, masks)
	at := func(lines []string, i int) string {
		if i < len(lines) {
			return lines[i]
		}
		return "(no such line)"
	}
	for i := range max(len(w), len(g)) {
		if at(w, i) != at(g, i) {
			t.Errorf("line %d of the quote differs (README.md is stale, or the program changed):\n  README:  %s\n  program: %s\n  masked README:  %s\n  masked program: %s",
				i+1, at(readme, i), at(got, i), at(w, i), at(g, i))
		}
	}
	if t.Failed() {
		t.Logf("the program printed (%d lines; the README quotes %d):\n%s", len(got), len(readme), output)
	}
}

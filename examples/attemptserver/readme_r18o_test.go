package main

import (
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
// ./examples/attemptserver -duration 1m` is what the program prints with
// the README's flags, run in-process on a port the system picks (the README
// shows the default 127.0.0.1:50051). Only the attempt ID and the port
// differ; the server is stopped as soon as it has printed.
func TestReadmeQuotesThisOutput(t *testing.T) {
	readme := quoteR18o(t, "```console\n$ go run ./examples/attemptserver")
	cmd, ok := strings.CutPrefix(readme[0], "$ go run ./examples/attemptserver")
	require.True(t, ok, readme[0])
	args := append(strings.Fields(cmd), "-addr", "127.0.0.1:0")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := &syncBuffer{}
	ready := make(chan info, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, out, &syncBuffer{}, ready) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the server stopped before it was ready: %v", err)
	}
	cancel()
	require.NoError(t, <-done)

	requireQuoteR18o(t, readme[1:], out.String(), []maskR18o{
		{re: regexp.MustCompile(`\b127\.0\.0\.1:\d+\b`), repl: "127.0.0.1:<port>"},
	})
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

// Package readmequote checks that the output a program prints is what
// README.md quotes for it, for the examples' tests: one block, compared line
// by line, with attempt IDs and the values a test names as varying masked.
package readmequote

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Block is the output block README.md (at readme, a path) quotes that
// begins at the first fence at or after marker, one string per line,
// without its fences.
func Block(t testing.TB, readme, marker string) []string {
	t.Helper()
	b, err := os.ReadFile(readme)
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

// Mask replaces, in one field of what a line says, a value that
// legitimately differs from run to run: Re's matches, by Repl, on lines
// matching Line (any line if nil) within a section whose heading (the last
// line not indented) matches Section (any if nil).
type Mask struct {
	Section, Line, Re *regexp.Regexp
	Repl              string
}

// attemptID is a UUIDv7. Each distinct ID in a block is numbered in the
// order it first appears, so where the same attempt is named twice the
// README and the program must both name one attempt.
var attemptID = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}`)

// masked is lines with every attempt ID numbered and masks applied.
func masked(lines []string, masks []Mask) []string {
	ids := map[string]string{}
	out := make([]string, len(lines))
	heading := ""
	for i, l := range lines {
		if l != "" && !strings.HasPrefix(l, " ") {
			heading = l
		}
		l = attemptID.ReplaceAllStringFunc(l, func(id string) string {
			if _, ok := ids[id]; !ok {
				ids[id] = fmt.Sprintf("<attempt %d>", len(ids)+1)
			}
			return ids[id]
		})
		for _, m := range masks {
			if (m.Section == nil || m.Section.MatchString(heading)) && (m.Line == nil || m.Line.MatchString(l)) {
				l = m.Re.ReplaceAllString(l, m.Repl)
			}
		}
		out[i] = l
	}
	return out
}

// Require compares README.md's quote (Block) with the program's output
// line by line after masking (attempt IDs always, then masks), and names
// every line that differs.
func Require(t testing.TB, readme []string, output string, masks []Mask) {
	t.Helper()
	got := strings.Split(strings.TrimSuffix(output, "\n"), "\n")
	w, g := masked(readme, masks), masked(got, masks)
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

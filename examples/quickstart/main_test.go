package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The quick start runs: the order is placed and recorded under the attempt
// its handler saw, and a call with no time to spare is refused before it is
// sent. Every refusal of a placing attempt is one that had no effect.
func TestQuickstartRuns(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), &out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.GreaterOrEqual(t, len(lines), 3, out.String())
	n := len(lines)
	for _, l := range lines[:n-3] {
		require.Regexp(t, `^attempt \d: not admitted \(ATTEMPT_UNVERIFIABLE, final true\): it had no effect anywhere; a new attempt in `, l)
	}
	m := regexp.MustCompile(`^placed the order under attempt ([0-9a-f-]{36})$`).FindStringSubmatch(lines[n-3])
	require.NotNil(t, m, lines[n-3])
	require.Equal(t, "its record: ATTEMPT_STATE_SUCCEEDED (try 1)", lines[n-2])
	require.Equal(t, "a call with 1µs to spare: not admitted (DEADLINE_UNREACHABLE, final true): it had no effect anywhere", lines[n-1])
}

// Every Go snippet of the README's quick start is in this program: each of
// its lines, in order, with runs of blanks made one (gofmt aligns comments
// differently where lines stand apart). A change to either without the
// other fails here.
func TestReadmeQuickStartIsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	text := string(readme)
	start := strings.Index(text, "## Quick start")
	end := strings.Index(text, "## Semantics")
	require.True(t, start >= 0 && end > start, "the README has a Quick start section before Semantics")
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	program := normalized(string(src))

	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(text[start:end], -1)
	require.Len(t, blocks, 3, "the quick start's Go snippets: server, client, outcome")
	for _, b := range blocks {
		at := 0
		for _, line := range normalized(b[1]) {
			i := indexFrom(program, at, line)
			require.GreaterOrEqual(t, i, 0, "README quick-start line not in examples/quickstart/main.go (in this order):\n%s", line)
			at = i + 1
		}
	}
}

var blanks = regexp.MustCompile(`[ \t]+`)

func normalized(s string) []string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(blanks.ReplaceAllString(l, " ")); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

func indexFrom(lines []string, from int, line string) int {
	for i := from; i < len(lines); i++ {
		if lines[i] == line {
			return i
		}
	}
	return -1
}

package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/internal/readmequote"
)

// TestReadmeQuotesThisOutput: the block README.md quotes for `go run
// ./examples/attemptserver -duration 1m` is what the program prints with
// the README's flags, run in-process on a port the system picks (the README
// shows the default 127.0.0.1:50051). Only the attempt ID and the port
// differ; the server is stopped as soon as it has printed.
func TestReadmeQuotesThisOutput(t *testing.T) {
	readme := readmequote.Block(t, "../../README.md", "```console\n$ go run ./examples/attemptserver")
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

	readmequote.Require(t, readme[1:], out.String(), []readmequote.Mask{
		{Re: regexp.MustCompile(`\b127\.0\.0\.1:\d+\b`), Repl: "127.0.0.1:<port>"},
	})
}

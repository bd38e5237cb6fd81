// Package examples holds only this test: every directory below it is an
// example program, meant to be copied out of the module and built there.
package examples

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportsNoInternalPackage: each example is meant to be copied out of
// the module and built there, as examples/quickstart can be, so none of the
// Go files under examples/ but tests (generated code included) may import an
// internal package, which Go refuses outside the module that holds it ("use
// of internal package … not allowed"). A review (r18) found examples/relay's
// and then examples/ledger's main.go importing internal/testproto and
// internal/testsvc; the test walks every example, present and future.
func TestImportsNoInternalPackage(t *testing.T) {
	checked := map[string]int{} // Go files checked per example directory
	var found []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked[strings.SplitN(filepath.ToSlash(path), "/", 2)[0]]++
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			if slices.Contains(strings.Split(p, "/"), "internal") {
				found = append(found, "examples/"+filepath.ToSlash(path)+" imports "+p)
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, found, "internal packages imported: a copy of the example outside the module would not build")

	// Every example directory holds Go files that were checked.
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	var examples int
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		examples++
		require.NotZerof(t, checked[e.Name()], "examples/%s: no Go file found to check", e.Name())
	}
	require.NotZero(t, examples, "no example found to check")
}

package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportsNoInternalPackage: the relay example is meant to be copied out
// of the module and built there, as examples/quickstart can be, so none of
// its Go files but its tests (its generated code included) may import an
// internal package, which Go refuses outside the module that holds it
// ("use of internal package … not allowed"). A review (r18) found main.go
// importing internal/testproto and internal/testsvc.
func TestImportsNoInternalPackage(t *testing.T) {
	var checked int
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err, path)
			require.False(t, slices.Contains(strings.Split(p, "/"), "internal"),
				"%s imports %s, an internal package: a copy of the example outside the module would not build", path, p)
		}
		return nil
	})
	require.NoError(t, err)
	require.NotZero(t, checked, "no Go file found to check")
}

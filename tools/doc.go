// Package tools pins the versions of the code generators and linters that
// tollgate's build uses. It holds no code: run them with
//
//	go tool -modfile=tools/go.mod buf ...
//
// from the repository root, as .ci/run and scripts/generate.sh do. benchstat
// is pinned here too, for the README's benchmark commands.
package tools

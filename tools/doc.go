// Package tools pins the versions of the code generators and linters that
// tollgate's build uses. It holds no code: run them with
//
//	go tool -modfile=tools/go.mod buf ...
//
// from the repository root (see .ci/run and the Makefile-free scripts there).
package tools

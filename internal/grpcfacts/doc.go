// Package grpcfacts holds no code: its tests prove the grpc-go behaviours
// tollgate builds on that DESIGN.md §6 does not already list, so that an
// upgrade that changes one of them fails here first, with a name.
package grpcfacts

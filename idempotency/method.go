package idempotency

import (
	"errors"
	"fmt"

	"github.com/tollgate-go/tollgate/internal/methodinfo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// ErrUnknownMethod is wrapped by [ResponseType]'s error when the method or its
// output type is not in the global protobuf registries.
var ErrUnknownMethod = errors.New("idempotency: method not in the protobuf registry")

// LevelOf returns the idempotency_level that a method's protobuf declaration
// gives it, read from protoregistry.GlobalFiles; IDEMPOTENCY_UNKNOWN for a
// method that declares none or is not registered. fullMethod is gRPC's
// "/package.Service/Method". Methods at NO_SIDE_EFFECTS keep no records
// (DESIGN.md §3.7). Safe for concurrent use; answers are cached, so a lookup
// after the first costs one map read.
func LevelOf(fullMethod string) descriptorpb.MethodOptions_IdempotencyLevel {
	return methodinfo.Of(fullMethod).Level
}

// BypassesRecords reports whether calls of fullMethod keep no records: the
// method is declared NO_SIDE_EFFECTS. Safe for concurrent use.
func BypassesRecords(fullMethod string) bool {
	return LevelOf(fullMethod) == descriptorpb.MethodOptions_NO_SIDE_EFFECTS
}

// ResponseType returns the output message type of a unary method, so that a
// SUCCEEDED record's response bytes can be replayed:
//
//	mt, err := idempotency.ResponseType(info.FullMethod)
//	msg := mt.New().Interface()
//	err = proto.Unmarshal(rec.GetResponse(), msg)
//
// It fails with an error wrapping [ErrUnknownMethod] for a method or output
// type that is not registered, and for a streaming method. Safe for
// concurrent use; answers are cached.
func ResponseType(fullMethod string) (protoreflect.MessageType, error) {
	info := methodinfo.Of(fullMethod)
	switch {
	case info.Output == nil:
		return nil, fmt.Errorf("%w: %q", ErrUnknownMethod, fullMethod)
	case info.Stream:
		return nil, fmt.Errorf("%w: %q is a streaming method", ErrUnknownMethod, fullMethod)
	}
	return info.Output, nil
}

// DecodeResponse unmarshals a SUCCEEDED unary record's response bytes into a
// new message of the method's output type; see [ResponseType].
func DecodeResponse(fullMethod string, response []byte) (proto.Message, error) {
	mt, err := ResponseType(fullMethod)
	if err != nil {
		return nil, err
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(response, m); err != nil {
		return nil, fmt.Errorf("idempotency: stored response of %q: %w", fullMethod, err)
	}
	return m, nil
}

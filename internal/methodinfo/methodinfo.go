// Package methodinfo reads what tollgate needs to know of a gRPC method from
// the protobuf registry: its declared idempotency_level and, for replaying a
// stored unary response, its output message type. Lookups are cached per
// full method name, so the hot path pays one sync.Map load.
package methodinfo

import (
	"strings"
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Level is a method's declared idempotency level.
type Level = descriptorpb.MethodOptions_IdempotencyLevel

// The levels of descriptor.proto.
const (
	Unknown       = descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN
	NoSideEffects = descriptorpb.MethodOptions_NO_SIDE_EFFECTS
	Idempotent    = descriptorpb.MethodOptions_IDEMPOTENT
)

// Info is what the registry says of one method. A method the registry does
// not know (a hand-written service) has level Unknown and no output type.
type Info struct {
	Level  Level
	Output protoreflect.MessageType // nil when unknown
	Stream bool                     // client or server streaming
}

// cache maps full method names to their Info. A typed map under a
// read-write mutex rather than a sync.Map: looking a string up in a sync.Map
// boxes it, an allocation on every call.
var cache = struct {
	mu sync.RWMutex
	m  map[string]Info
}{m: map[string]Info{}}

// Of returns the Info of fullMethod ("/pkg.Service/Method"). Safe for
// concurrent use; after the first lookup of a method it costs one read lock
// and allocates nothing.
func Of(fullMethod string) Info {
	cache.mu.RLock()
	info, ok := cache.m[fullMethod]
	cache.mu.RUnlock()
	if ok {
		return info
	}
	info = lookup(fullMethod)
	cache.mu.Lock()
	cache.m[fullMethod] = info
	cache.mu.Unlock()
	return info
}

func lookup(fullMethod string) Info {
	name := strings.TrimPrefix(fullMethod, "/")
	i := strings.LastIndexByte(name, '/')
	if i <= 0 || i == len(name)-1 {
		return Info{}
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name[:i] + "." + name[i+1:]))
	if err != nil {
		return Info{}
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return Info{}
	}
	info := Info{Stream: md.IsStreamingClient() || md.IsStreamingServer()}
	if opts, ok := md.Options().(*descriptorpb.MethodOptions); ok && opts != nil {
		info.Level = opts.GetIdempotencyLevel()
	}
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err == nil {
		info.Output = mt
	}
	return info
}

// Package methodinfo reads what tollgate needs to know of a gRPC method from
// the protobuf registry: its declared idempotency_level, its input message
// type (for receiving a server-streaming call's one request before its
// handler runs, so that the call's record fingerprints it) and its output
// message type (for replaying a stored unary response). Lookups are cached
// per full method name, so the hot path pays one atomic load and a map read.
package methodinfo

import (
	"maps"
	"strings"
	"sync"
	"sync/atomic"

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
// not know (a hand-written service, or one registered under another name)
// has level Unknown and no input or output type; so has a known method's
// input or output when the registry holds no Go type for that message.
type Info struct {
	Level  Level
	Input  protoreflect.MessageType // nil when unknown
	Output protoreflect.MessageType // nil when unknown
	Stream bool                     // client or server streaming
}

// maxUnknown bounds the names cached that the registry does not know. Every
// method a process serves or calls through generated code is registered, a
// finite set, and cached; but a server whose stream interceptor runs for an
// UnknownServiceHandler (a proxy) sees any name a peer cares to send, and
// caching those without a bound would let a peer grow the process's memory.
// Beyond the bound, unknown names are looked up on every call, without the
// writers' lock: the registry's own lookups take only a read lock.
const maxUnknown = 256

// cache maps full method names to their Info: a map that is never modified
// once published (copy on write), so readers take no lock and contend on
// nothing; mu orders the writers. Looking a string up in a sync.Map would
// box it, an allocation on every call.
var cache struct {
	mu      sync.Mutex
	m       atomic.Pointer[map[string]Info]
	unknown int // names cached that the registry does not know; guarded by mu
	// full is set, under mu, once unknown reaches maxUnknown: a name the
	// registry does not know is then answered without taking mu.
	full atomic.Bool
}

// Of returns the Info of fullMethod ("/pkg.Service/Method"). Safe for
// concurrent use; once a method is cached it costs an atomic load and a map
// read, and allocates nothing.
func Of(fullMethod string) Info {
	if m := cache.m.Load(); m != nil {
		if info, ok := (*m)[fullMethod]; ok {
			return info
		}
	}
	info, known := lookup(fullMethod)
	if !known && cache.full.Load() {
		return info
	}
	cache.mu.Lock()
	defer cache.mu.Unlock()
	if !known && cache.unknown >= maxUnknown {
		return info
	}
	var old map[string]Info
	if m := cache.m.Load(); m != nil {
		old = *m
	}
	if _, ok := old[fullMethod]; ok {
		return info
	}
	next := make(map[string]Info, len(old)+1)
	maps.Copy(next, old)
	next[fullMethod] = info
	cache.m.Store(&next)
	if !known {
		cache.unknown++
		cache.full.Store(cache.unknown >= maxUnknown)
	}
	return info
}

// lookup reads fullMethod's Info from the registry, and whether the registry
// knows the method.
func lookup(fullMethod string) (Info, bool) {
	name := strings.TrimPrefix(fullMethod, "/")
	i := strings.LastIndexByte(name, '/')
	if i <= 0 || i == len(name)-1 {
		return Info{}, false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name[:i] + "." + name[i+1:]))
	if err != nil {
		return Info{}, false
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return Info{}, false
	}
	info := Info{Stream: md.IsStreamingClient() || md.IsStreamingServer()}
	if opts, ok := md.Options().(*descriptorpb.MethodOptions); ok && opts != nil {
		info.Level = opts.GetIdempotencyLevel()
	}
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName()); err == nil {
		info.Input = mt
	}
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err == nil {
		info.Output = mt
	}
	return info, true
}

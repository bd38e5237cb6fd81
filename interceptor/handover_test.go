package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/runtime/protoiface"
	"google.golang.org/protobuf/runtime/protoimpl"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// legacyReq and legacyResp are messages as protoc-gen-go before 1.4 (APIv1)
// generated them: no ProtoReflect method. grpc-go's proto codec still
// accepts them (protoadapt.MessageV1), and golang/protobuf ≥ 1.4's
// proto.RegisterType puts them in protoregistry.GlobalTypes through
// protoimpl.X.LegacyMessageTypeOf, as done here.
type legacyReq struct {
	Key string `protobuf:"bytes,1,opt,name=key,proto3" json:"key,omitempty"`
}

func (m *legacyReq) Reset()         { *m = legacyReq{} }
func (m *legacyReq) String() string { return "legacyReq{" + m.Key + "}" }
func (*legacyReq) ProtoMessage()    {}

type legacyResp struct {
	Value string `protobuf:"bytes,1,opt,name=value,proto3" json:"value,omitempty"`
}

func (m *legacyResp) Reset()         { *m = legacyResp{} }
func (m *legacyResp) String() string { return "legacyResp{" + m.Value + "}" }
func (*legacyResp) ProtoMessage()    {}

const legacyMethod = "/tollgate.testing.legacy.v1.LegacyService/Feed"

// legacyFile declares LegacyService.Feed, a server-streaming method with
// side effects (so it keeps records) whose messages are legacyReq and
// legacyResp.
var legacyFile = &descriptorpb.FileDescriptorProto{
	Name:    proto.String("tollgate/testing/legacy/v1/legacy.proto"),
	Package: proto.String("tollgate.testing.legacy.v1"),
	Syntax:  proto.String("proto3"),
	MessageType: []*descriptorpb.DescriptorProto{
		{Name: proto.String("LegacyReq"), Field: []*descriptorpb.FieldDescriptorProto{{Name: proto.String("key"), Number: proto.Int32(1),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), JsonName: proto.String("key")}}},
		{Name: proto.String("LegacyResp"), Field: []*descriptorpb.FieldDescriptorProto{{Name: proto.String("value"), Number: proto.Int32(1),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), JsonName: proto.String("value")}}},
	},
	Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("LegacyService"), Method: []*descriptorpb.MethodDescriptorProto{{
		Name: proto.String("Feed"), InputType: proto.String(".tollgate.testing.legacy.v1.LegacyReq"), OutputType: proto.String(".tollgate.testing.legacy.v1.LegacyResp"),
		ServerStreaming: proto.Bool(true)}}}},
}

func init() {
	f, err := protodesc.NewFile(legacyFile, protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(f); err != nil {
		panic(err)
	}
	for _, r := range []struct {
		m    protoiface.MessageV1
		name string
	}{{(*legacyReq)(nil), "tollgate.testing.legacy.v1.LegacyReq"}, {(*legacyResp)(nil), "tollgate.testing.legacy.v1.LegacyResp"}} {
		if err := protoregistry.GlobalTypes.RegisterMessage(protoimpl.X.LegacyMessageTypeOf(r.m, protoreflect.FullName(r.name))); err != nil {
			panic(err)
		}
	}
}

type legacyServer interface{}

var legacyDesc = grpc.ServiceDesc{
	ServiceName: "tollgate.testing.legacy.v1.LegacyService",
	HandlerType: (*legacyServer)(nil),
	Streams: []grpc.StreamDesc{{StreamName: "Feed", ServerStreams: true, Handler: func(_ any, stream grpc.ServerStream) error {
		m := new(legacyReq) // what APIv1 generated handlers do
		if err := stream.RecvMsg(m); err != nil {
			return err
		}
		return stream.SendMsg(&legacyResp{Value: "got " + m.Key})
	}}},
}

// A recorded server-streaming method whose request is an APIv1 message (from
// protoc-gen-go before 1.4), or whose handler receives it as a dynamic
// message of its own descriptor, works as without a store: tollgate receives
// the request first, into the type the registry knows, and hands it over in
// the handler's own Go form. Before, the handler's RecvMsg got INTERNAL and
// every try of the call ended UNKNOWN.
func TestRecordedServerStreamHandsTheRequestToAnyGoFormOfIt(t *testing.T) {
	// A descriptor of the same file built apart from the registry: a
	// dynamic message of it has the request's name but another descriptor.
	apart, err := protodesc.NewFile(legacyFile, protoregistry.GlobalFiles)
	require.NoError(t, err)
	dynamicReq := apart.Messages().ByName("LegacyReq")
	for _, tc := range []struct {
		name string
		recv func(grpc.ServerStream) (string, error)
	}{
		{"APIv1", func(st grpc.ServerStream) (string, error) {
			m := new(legacyReq) // what APIv1 generated handlers do
			err := st.RecvMsg(m)
			return m.Key, err
		}},
		{"dynamic", func(st grpc.ServerStream) (string, error) {
			m := dynamicpb.NewMessage(dynamicReq)
			err := st.RecvMsg(m)
			return m.Get(dynamicReq.Fields().ByName("key")).String(), err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			desc := legacyDesc
			desc.Streams = []grpc.StreamDesc{{StreamName: "Feed", ServerStreams: true, Handler: func(_ any, stream grpc.ServerStream) error {
				key, err := tc.recv(stream)
				if err != nil {
					return err
				}
				return stream.SendMsg(&legacyResp{Value: "got " + key})
			}}}
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { s.RegisterService(&desc, struct{}{}) },
				serverOpts(interceptor.WithAttemptStore(memoryStore(t)))...)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			cs, err := end.DialT(t).NewStream(ctx, &desc.Streams[0], legacyMethod)
			require.NoError(t, err)
			require.NoError(t, cs.SendMsg(&legacyReq{Key: "k"}))
			require.NoError(t, cs.CloseSend())
			var resp legacyResp
			err = cs.RecvMsg(&resp)
			require.NoError(t, err, "code %v", grpcstatus.Code(err))
			require.Equal(t, "got k", resp.Value)
		})
	}
}

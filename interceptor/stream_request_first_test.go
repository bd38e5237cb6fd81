package interceptor_test

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// rawFrame and rawCodec are a pass-through proxy's codec: the handler
// receives and sends frames, never the registry's generated types.
type rawFrame struct{ b []byte }

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*rawFrame)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return f.b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*rawFrame)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	f.b = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// handWrittenConsume registers h as TestService's Consume, a
// server-streaming method whose request type the registry knows.
func handWrittenConsume(h grpc.StreamHandler) func(*grpc.Server) {
	desc := grpc.ServiceDesc{
		ServiceName: "tollgate.testing.v1.TestService",
		HandlerType: (*any)(nil),
		Streams:     []grpc.StreamDesc{{StreamName: "Consume", ServerStreams: true, Handler: h}},
	}
	return func(s *grpc.Server) { s.RegisterService(&desc, struct{}{}) }
}

// serverKinds are the servers a server-streaming handler must work the same
// on: plain grpc-go; tollgate with nothing to guard (no store, no admission),
// where the interceptor leaves the request to the handler; and tollgate with
// admission and WithoutStreamRequestFirst.
func serverKinds(t *testing.T) []struct {
	name string
	opts []grpc.ServerOption
} {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	return []struct {
		name string
		opts []grpc.ServerOption
	}{
		{"plain grpc-go", nil},
		{"tollgate, nothing to guard", serverOpts()},
		{"tollgate, admission, WithoutStreamRequestFirst", serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithoutStreamRequestFirst())},
	}
}

// A proxy whose codec is forced to raw frames serves server-streaming calls
// as plain grpc-go does. Receiving the request first, in the registry's type
// through that codec, failed every such call.
func TestServerStreamWithARawCodecWorksAsWithoutTollgate(t *testing.T) {
	proxy := handWrittenConsume(func(_ any, ss grpc.ServerStream) error {
		in := new(rawFrame)
		if err := ss.RecvMsg(in); err != nil {
			return err
		}
		var req testingv1.ConsumeRequest
		if err := proto.Unmarshal(in.b, &req); err != nil {
			return err
		}
		b, err := proto.Marshal(&testingv1.ConsumeResponse{Value: req.GetKey()})
		if err != nil {
			return err
		}
		return ss.SendMsg(&rawFrame{b: b})
	})
	for _, k := range serverKinds(t) {
		t.Run(k.name, func(t *testing.T) {
			end := testsvc.StartT(t, testsvc.Bufconn, proxy, append([]grpc.ServerOption{grpc.ForceServerCodec(rawCodec{})}, k.opts...)...)
			st, err := testingv1.NewTestServiceClient(end.DialT(t)).Consume(t.Context(), &testingv1.ConsumeRequest{Key: "k", Count: 1})
			require.NoError(t, err)
			got, err := recvConsumed(st)
			require.NoError(t, err)
			require.Equal(t, []string{"k"}, got)
		})
	}
}

// A handler that greets its client before it receives the request serves a
// client that waits for the greeting, as plain grpc-go does. Receiving the
// request first deadlocked the two until the client's deadline.
func TestServerStreamThatSendsFirstWorksAsWithoutTollgate(t *testing.T) {
	greeter := handWrittenConsume(func(_ any, ss grpc.ServerStream) error {
		if err := ss.SendMsg(&testingv1.ConsumeResponse{Value: "hello"}); err != nil {
			return err
		}
		m := new(testingv1.ConsumeRequest)
		if err := ss.RecvMsg(m); err != nil {
			return err
		}
		return ss.SendMsg(&testingv1.ConsumeResponse{Value: m.GetKey()})
	})
	for _, k := range serverKinds(t) {
		t.Run(k.name, func(t *testing.T) {
			conn := testsvc.StartT(t, testsvc.Bufconn, greeter, k.opts...).DialT(t)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			cs, err := conn.NewStream(ctx, &testingv1.TestService_ServiceDesc.Streams[3], consumeMethod)
			require.NoError(t, err)
			greeting := new(testingv1.ConsumeResponse)
			require.NoError(t, cs.RecvMsg(greeting), "the greeting comes before the request")
			require.Equal(t, "hello", greeting.GetValue())
			require.NoError(t, cs.SendMsg(&testingv1.ConsumeRequest{Key: "k"}))
			require.NoError(t, cs.CloseSend())
			echo := new(testingv1.ConsumeResponse)
			require.NoError(t, cs.RecvMsg(echo))
			require.Equal(t, "k", echo.GetValue())
		})
	}
}

// A handler that reads the request as another message gets INTERNAL where
// tollgate receives the request first (admission here), naming the option
// that serves it: the client's bytes were decoded as the registry's type,
// and reading that decoding as another message can lose what grpc-go
// decodes from the bytes themselves (here a count wider than the registry's
// int32). Under WithoutStreamRequestFirst the handler reads the bytes, as on
// plain grpc-go.
func TestRequestReadAsAnotherMessageNeedsWithoutStreamRequestFirst(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	// The handler reads Consume's request as a message whose field 2 is an
	// int64; the client sends it a count of 2^40 in that field's varint.
	wide := (&descriptorpb.FileDescriptorProto{
		Name: proto.String("tollgate/testing/wide/v1/wide.proto"), Package: proto.String("tollgate.testing.wide.v1"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("WideRequest"), Field: []*descriptorpb.FieldDescriptorProto{
			{Name: proto.String("key"), Number: proto.Int32(1), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), JsonName: proto.String("key")},
			{Name: proto.String("count"), Number: proto.Int32(2), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum(), JsonName: proto.String("count")},
		}}},
	})
	f, err := protodesc.NewFile(wide, new(protoregistry.Files))
	require.NoError(t, err)
	wideReq := f.Messages().ByName("WideRequest")
	reader := handWrittenConsume(func(_ any, ss grpc.ServerStream) error {
		m := dynamicpb.NewMessage(wideReq)
		if err := ss.RecvMsg(m); err != nil {
			return err
		}
		return ss.SendMsg(&testingv1.ConsumeResponse{Value: fmt.Sprintf("%s/%d", m.Get(wideReq.Fields().ByName("key")).String(), m.Get(wideReq.Fields().ByName("count")).Int())})
	})
	wire := protowire.AppendTag(nil, 1, protowire.BytesType)
	wire = protowire.AppendString(wire, "k")
	wire = protowire.AppendTag(wire, 2, protowire.VarintType)
	wire = protowire.AppendVarint(wire, 1<<40)
	send := func(t *testing.T, conn *grpc.ClientConn) ([]string, error) {
		cs, err := conn.NewStream(t.Context(), &testingv1.TestService_ServiceDesc.Streams[3], consumeMethod, grpc.ForceCodec(rawCodec{}))
		require.NoError(t, err)
		require.NoError(t, cs.SendMsg(&rawFrame{b: wire}))
		require.NoError(t, cs.CloseSend())
		var got []string
		for {
			out := new(rawFrame)
			if err := cs.RecvMsg(out); err == io.EOF {
				return got, nil
			} else if err != nil {
				return got, err
			}
			var resp testingv1.ConsumeResponse
			require.NoError(t, proto.Unmarshal(out.b, &resp))
			got = append(got, resp.GetValue())
		}
	}
	for _, tc := range []struct {
		name string
		opts []grpc.ServerOption
		want []string
		code codes.Code
	}{
		{"plain grpc-go", nil, []string{"k/1099511627776"}, codes.OK},
		{"tollgate, request first", serverOpts(interceptor.WithAdmission(ctrl)), nil, codes.Internal},
		{"tollgate, WithoutStreamRequestFirst", serverOpts(interceptor.WithAdmission(ctrl), interceptor.WithoutStreamRequestFirst()), []string{"k/1099511627776"}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := send(t, testsvc.StartT(t, testsvc.Bufconn, reader, tc.opts...).DialT(t))
			require.Equal(t, tc.code, grpcstatus.Code(err), "%v", err)
			require.Equal(t, tc.want, got)
			if tc.code != codes.OK {
				require.ErrorContains(t, err, "WithoutStreamRequestFirst")
			}
		})
	}
}

package interceptor_test

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

const idempotentUp = "/tollgate.testing.idem.v1.S/Up"

// idempotentStreamRegister registers tollgate.testing.idem.v1.S, whose client-streaming Up is
// declared IDEMPOTENT, in the global registry (once).
func idempotentStreamRegister(t *testing.T) {
	if _, err := protoregistry.GlobalFiles.FindDescriptorByName("tollgate.testing.idem.v1.S"); err == nil {
		return
	}
	dep := testingv1.File_tollgate_testing_v1_testing_proto
	fd := &descriptorpb.FileDescriptorProto{
		Name: proto.String("tollgate/testing/idem/v1/s.proto"), Package: proto.String("tollgate.testing.idem.v1"), Syntax: proto.String("proto3"),
		Dependency: []string{dep.Path()},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("S"),
			Method: []*descriptorpb.MethodDescriptorProto{{
				Name: proto.String("Up"), InputType: proto.String(".tollgate.testing.v1.UploadRequest"),
				OutputType: proto.String(".tollgate.testing.v1.UploadResponse"), ClientStreaming: proto.Bool(true),
				Options: &descriptorpb.MethodOptions{IdempotencyLevel: descriptorpb.MethodOptions_IDEMPOTENT.Enum()},
			}},
		}},
	}
	f, err := protodesc.NewFile(fd, protoregistry.GlobalFiles)
	require.NoError(t, err)
	require.NoError(t, protoregistry.GlobalFiles.RegisterFile(f))
}

// The stream counterpart of TestRecordlessRepeatThenFenceElsewhereStaysUnknown:
// an IDEMPOTENT client-streaming call whose try 1 ran at a
// store-less backend (query UNIMPLEMENTED) is repeated without the query;
// try 2, past the replay limit, is lost before the backend with records saw
// it, after the recordless mark lapsed. Its fence FENCED(2) vouches only for
// that store: a review found that the stream ended NOT_ADMITTED, because
// committedResult handed the fence's answer back without conclude.
func TestStreamRecordlessRepeatThenFenceElsewhereStaysUnknown(t *testing.T) {
	idempotentStreamRegister(t)
	var effects, queries, offsetNs, tries atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offsetNs.Load())) }
	outerUnary := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasSuffix(info.FullMethod, "/FenceAttempt") && queries.Add(1) == 1 {
			return nil, grpcstatus.Error(codes.Unimplemented, "no records")
		}
		return handler(ctx, req)
	})
	outerStream := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod != idempotentUp {
			return handler(srv, ss)
		}
		switch tries.Add(1) {
		case 1: // the store-less backend runs it; the answer is lost
			if err := ss.RecvMsg(&testingv1.UploadRequest{}); err != nil {
				return err
			}
			effects.Add(1)
			return grpcstatus.Error(codes.Unavailable, "connection reset")
		default: // lost before it reached the backend with records
			for {
				if err := ss.RecvMsg(&testingv1.UploadRequest{}); err != nil {
					break
				}
			}
			offsetNs.Store(int64(2 * time.Minute)) // the recordless mark lapses
			return grpcstatus.Error(codes.Unavailable, "connection reset")
		}
	})
	store := memoryStore(t)
	desc := grpc.ServiceDesc{ServiceName: "tollgate.testing.idem.v1.S", HandlerType: (*any)(nil), Streams: []grpc.StreamDesc{{
		StreamName: "Up", ClientStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			effects.Add(1)
			for {
				if err := ss.RecvMsg(&testingv1.UploadRequest{}); err == io.EOF {
					return ss.SendMsg(&testingv1.UploadResponse{})
				} else if err != nil {
					return err
				}
			}
		},
	}}}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		s.RegisterService(&desc, struct{}{})
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, append([]grpc.ServerOption{outerUnary, outerStream}, serverOpts(interceptor.WithAttemptStore(store))...)...)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithClientClock(clock),
		interceptor.WithoutRetryBudget(),
		interceptor.WithAttemptTimeout(10*time.Minute),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x", "y")
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, idempotentUp)
	require.NoError(t, err)
	require.NoError(t, st.SendMsg(&testingv1.UploadRequest{Value: "first"}))
	time.Sleep(100 * time.Millisecond) // try 1 ended
	big := strings.Repeat("x", 64<<10)
	for range interceptor.StreamReplayLimit/(64<<10) + 2 {
		if err := st.SendMsg(&testingv1.UploadRequest{Value: big}); err != nil {
			break
		}
	}
	require.NoError(t, st.CloseSend())
	err = st.RecvMsg(&testingv1.UploadResponse{})
	t.Logf("tries %d, queries %d, result %v", tries.Load(), queries.Load(), err)
	require.GreaterOrEqual(t, tries.Load(), int64(2), "precondition: repeated without the query")
	require.Equal(t, int64(1), effects.Load(), "try 1 took effect")
	require.Error(t, err)
	require.NotEqual(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind,
		"a fence at one backend does not vouch for a try another backend ran: %v", err)
}

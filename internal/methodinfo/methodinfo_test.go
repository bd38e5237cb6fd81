package methodinfo_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/internal/methodinfo"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/protobuf/proto"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		method string
		level  methodinfo.Level
		input  proto.Message
		output proto.Message
		stream bool
	}{
		{testingv1.TestService_Get_FullMethodName, methodinfo.NoSideEffects, &testingv1.GetRequest{}, &testingv1.GetResponse{}, false},
		{testingv1.TestService_Put_FullMethodName, methodinfo.Idempotent, &testingv1.PutRequest{}, &testingv1.PutResponse{}, false},
		{testingv1.TestService_Apply_FullMethodName, methodinfo.Unknown, &testingv1.ApplyRequest{}, &testingv1.ApplyResponse{}, false},
		{testingv1.TestService_Watch_FullMethodName, methodinfo.NoSideEffects, &testingv1.WatchRequest{}, &testingv1.WatchResponse{}, true},
		{testingv1.TestService_Chat_FullMethodName, methodinfo.Unknown, &testingv1.ChatRequest{}, &testingv1.ChatResponse{}, true},
		{testingv1.TestService_Consume_FullMethodName, methodinfo.Unknown, &testingv1.ConsumeRequest{}, &testingv1.ConsumeResponse{}, true},
		{tollgatev1.AttemptService_GetAttempt_FullMethodName, methodinfo.NoSideEffects, &tollgatev1.GetAttemptRequest{}, &tollgatev1.AttemptRecord{}, false},
		{tollgatev1.AttemptService_FenceAttempt_FullMethodName, methodinfo.Idempotent, &tollgatev1.FenceAttemptRequest{}, &tollgatev1.AttemptRecord{}, false},
	} {
		t.Run(tc.method, func(t *testing.T) {
			info := methodinfo.Of(tc.method)
			require.Equal(t, tc.level, info.Level)
			require.Equal(t, tc.stream, info.Stream)
			require.NotNil(t, info.Input)
			require.Equal(t, tc.input.ProtoReflect().Descriptor().FullName(), info.Input.Descriptor().FullName())
			require.NotNil(t, info.Output)
			require.Equal(t, tc.output.ProtoReflect().Descriptor().FullName(), info.Output.Descriptor().FullName())
			require.Equal(t, info, methodinfo.Of(tc.method), "cached answer differs")
		})
	}
	for _, bad := range []string{"", "/", "//", "/pkg.Svc/", "nope", "/no.such.Service/Method", "/tollgate.v1.AttemptService/Nope"} {
		require.Equal(t, methodinfo.Info{}, methodinfo.Of(bad), bad)
	}
}

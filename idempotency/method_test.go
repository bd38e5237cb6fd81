package idempotency_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

func TestLevelOf(t *testing.T) {
	const svc = "/tollgate.testing.v1.TestService/"
	cases := map[string]descriptorpb.MethodOptions_IdempotencyLevel{
		svc + "Get":                              descriptorpb.MethodOptions_NO_SIDE_EFFECTS,
		svc + "Put":                              descriptorpb.MethodOptions_IDEMPOTENT,
		svc + "Apply":                            descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
		svc + "Watch":                            descriptorpb.MethodOptions_NO_SIDE_EFFECTS,
		"/tollgate.v1.AttemptService/GetAttempt": descriptorpb.MethodOptions_NO_SIDE_EFFECTS,
		"/tollgate.v1.AttemptService/FenceAttempt": descriptorpb.MethodOptions_IDEMPOTENT,
		"/no.Such/Method":                          descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
		"garbage":                                  descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN,
	}
	for m, want := range cases {
		require.Equal(t, want, idempotency.LevelOf(m), m)
		require.Equal(t, want, idempotency.LevelOf(m), "%s (cached)", m)
		require.Equal(t, want == descriptorpb.MethodOptions_NO_SIDE_EFFECTS, idempotency.BypassesRecords(m), m)
	}
	allocs := testing.AllocsPerRun(100, func() { idempotency.LevelOf(svc + "Put") })
	require.Zero(t, allocs)
}

func TestResponseTypeReplaysStoredBytes(t *testing.T) {
	const put = "/tollgate.testing.v1.TestService/Put"
	b, err := proto.Marshal(&testingv1.PutResponse{Value: "stored"})
	require.NoError(t, err)
	mt, err := idempotency.ResponseType(put)
	require.NoError(t, err)
	require.Equal(t, "tollgate.testing.v1.PutResponse", string(mt.Descriptor().FullName()))
	m, err := idempotency.DecodeResponse(put, b)
	require.NoError(t, err)
	require.True(t, proto.Equal(&testingv1.PutResponse{Value: "stored"}, m))

	for _, m := range []string{"/tollgate.testing.v1.TestService/Watch", "/tollgate.testing.v1.TestService/Chat", "/no.Such/Method"} {
		_, err := idempotency.ResponseType(m)
		require.ErrorIs(t, err, idempotency.ErrUnknownMethod, m)
	}
	_, err = idempotency.DecodeResponse(put, []byte{0xff})
	require.Error(t, err)
}

package interceptor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// tokenCreds is a per-RPC credential: every RPC carries authorization.
type tokenCreds struct{}

func (tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer ledger"}, nil
}
func (tokenCreds) RequireTransportSecurity() bool { return false }

// TestResolutionQueryCarriesDefaultCallOptions: a client whose
// credentials are a default call option (grpc.WithDefaultCallOptions(
// grpc.PerRPCCredentials(...))) talks to a server that refuses RPCs without
// them. The first try's answer is lost after the commit; the owner's
// FenceAttempt must carry the same credentials as the tries, or the server
// refuses it and a call whose response is stored ends UNKNOWN. Found by
// examples/ledger.
func TestResolutionQueryCarriesDefaultCallOptions(t *testing.T) {
	ledger := newLedger(nil)
	var dropped, refused atomic.Bool
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("authorization")) == 0 {
			refused.Store(true)
			return nil, grpcstatus.Error(codes.Unauthenticated, "no credentials")
		}
		resp, err := h(ctx, req)
		if info.FullMethod == testingv1.TestService_Apply_FullMethodName && err == nil && dropped.CompareAndSwap(false, true) {
			return nil, grpcstatus.Error(codes.Unavailable, "connection reset after commit")
		}
		return resp, err
	})
	end := recordedServer(t, &ledger.Service, memoryStore(t), outer)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	), grpc.WithDefaultCallOptions(grpc.PerRPCCredentials(tokenCreds{})))...))

	resp, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 5})
	require.Equal(t, int64(1), ledger.effects.Load(), "never twice")
	require.False(t, refused.Load(), "the resolution query carries the dial's default call options")
	require.NoError(t, err)
	require.Equal(t, int64(5), resp.GetTotal(), "the stored response")
}

// appCodec is a caller's own codec for its own messages, named "proto" so
// that the server decodes what it sends with its protobuf codec; it knows
// nothing of tollgate's AttemptService messages.
type appCodec struct{ used atomic.Int64 }

func (c *appCodec) Marshal(v any) ([]byte, error) {
	if _, ok := v.(*tollgatev1.FenceAttemptRequest); ok {
		return nil, errors.New("appCodec: not one of the application's messages")
	}
	c.used.Add(1)
	return proto.Marshal(v.(proto.Message))
}

func (c *appCodec) Unmarshal(data []byte, v any) error {
	if _, ok := v.(*tollgatev1.AttemptRecord); ok {
		return errors.New("appCodec: not one of the application's messages")
	}
	return proto.Unmarshal(data, v.(proto.Message))
}

func (*appCodec) Name() string { return "proto" }

// appCodecV0 is appCodec as a grpc.Codec (String instead of Name), the kind
// the deprecated grpc.CallCustomCodec takes.
type appCodecV0 struct{ appCodec }

func (*appCodecV0) String() string { return "proto" }

// A caller that sets its own codec on every call (grpc.ForceCodec, or the
// deprecated grpc.CallCustomCodec, as a default call option) still has its
// tries resolved: the resolution query to AttemptService does not go
// through the caller's codec.
func TestResolutionQueryIgnoresTheCallersCodec(t *testing.T) {
	v0 := &appCodecV0{}
	//lint:ignore SA1019 the deprecated option still sets a call's codec, and callers still use it
	custom := grpc.CallCustomCodec(v0)
	forced := &appCodec{}
	for _, c := range []struct {
		name  string
		codec *appCodec
		opt   grpc.CallOption
	}{{"ForceCodec", forced, grpc.ForceCodec(forced)}, {"CallCustomCodec", &v0.appCodec, custom}} {
		t.Run(c.name, func(t *testing.T) {
			ledger := newLedger(nil)
			var dropped atomic.Bool
			outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				resp, err := h(ctx, req)
				if info.FullMethod == testingv1.TestService_Apply_FullMethodName && err == nil && dropped.CompareAndSwap(false, true) {
					return nil, grpcstatus.Error(codes.Unavailable, "connection reset after commit")
				}
				return resp, err
			})
			end := recordedServer(t, &ledger.Service, memoryStore(t), outer)
			client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(
				interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
			), grpc.WithDefaultCallOptions(c.opt))...))

			resp, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 5})
			require.Equal(t, int64(1), ledger.effects.Load(), "never twice")
			require.NoError(t, err, "the query must not use the caller's codec")
			require.Equal(t, int64(5), resp.GetTotal(), "the stored response")
			require.Positive(t, c.codec.used.Load(), "the tries used the caller's codec")
		})
	}
}

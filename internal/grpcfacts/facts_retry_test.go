package grpcfacts_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// factsSC is a service config whose retry policy repeats UNAVAILABLE up to 3 times.
const factsSC = `{"methodConfig":[{"name":[{"service":"facts.Svc"}],
	"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.001s","maxBackoff":"0.001s","backoffMultiplier":1,"retryableStatusCodes":["UNAVAILABLE"]}}]}`

func unavailable(context.Context) (*emptypb.Empty, error) {
	return nil, grpcstatus.Error(codes.Unavailable, "down")
}

// DESIGN §6: grpc.WithDisableRetry() stops service-config retries. The
// control (same config, retry enabled) shows the config would repeat the
// call, so the fact is not a tautology of a policy that never applies.
func TestDisableRetryStopsServiceConfigRetry(t *testing.T) {
	conn, n := factsServe(t, unavailable, nil, grpc.WithDefaultServiceConfig(factsSC))
	require.Equal(t, codes.Unavailable, grpcstatus.Code(factsInvoke(t.Context(), conn)))
	require.Equal(t, int64(3), n.Load(), "control: the service config's policy repeats the call")

	conn, n = factsServe(t, unavailable, nil, grpc.WithDefaultServiceConfig(factsSC), grpc.WithDisableRetry())
	require.Equal(t, codes.Unavailable, grpcstatus.Code(factsInvoke(t.Context(), conn)))
	require.Equal(t, int64(1), n.Load(), "WithDisableRetry: one try only")
}

// DESIGN §6: grpc-go's retry acts only on trailers-only responses: once the
// server sent a header, the call is committed and not repeated.
func TestRetryOnlyOnTrailersOnly(t *testing.T) {
	afterHeader := func(ctx context.Context) (*emptypb.Empty, error) {
		require.NoError(t, grpc.SendHeader(ctx, metadata.Pairs("x", "1")))
		return nil, grpcstatus.Error(codes.Unavailable, "down")
	}
	conn, n := factsServe(t, afterHeader, nil, grpc.WithDefaultServiceConfig(factsSC))
	require.Equal(t, codes.Unavailable, grpcstatus.Code(factsInvoke(t.Context(), conn)))
	require.Equal(t, int64(1), n.Load(), "a header was sent: no retry")
}

// DESIGN §6: grpc-retry-pushback-ms acts on a trailers-only response (a
// negative value stops grpc-go's retry), and not once a header was sent:
// there, the retry does not happen at all.
func TestPushbackActsOnTrailersOnly(t *testing.T) {
	stop := func(ctx context.Context) (*emptypb.Empty, error) {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", "-1"))
		return nil, grpcstatus.Error(codes.Unavailable, "down")
	}
	conn, n := factsServe(t, stop, nil, grpc.WithDefaultServiceConfig(factsSC))
	require.Equal(t, codes.Unavailable, grpcstatus.Code(factsInvoke(t.Context(), conn)))
	require.Equal(t, int64(1), n.Load(), "trailers-only pushback -1 stops the retry")

	// A positive pushback on a trailers-only answer is obeyed: the retry follows it.
	goOn := func(ctx context.Context) (*emptypb.Empty, error) {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", "1"))
		return nil, grpcstatus.Error(codes.Unavailable, "down")
	}
	conn, n = factsServe(t, goOn, nil, grpc.WithDefaultServiceConfig(factsSC))
	require.Equal(t, codes.Unavailable, grpcstatus.Code(factsInvoke(t.Context(), conn)))
	require.Equal(t, int64(3), n.Load())
}

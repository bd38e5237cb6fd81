package grpcfacts_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/emptypb"
)

func ok(context.Context) (*emptypb.Empty, error) { return &emptypb.Empty{}, nil }

// DESIGN §6: one tap per server; a second InTapHandle panics (hence
// AdmissionTap + WithoutAdmissionTap for servers with a tap of their own).
func TestSecondTapPanics(t *testing.T) {
	h := func(ctx context.Context, _ *tap.Info) (context.Context, error) { return ctx, nil }
	require.Panics(t, func() { _ = grpc.NewServer(grpc.InTapHandle(h), grpc.InTapHandle(h)) })
}

// DESIGN §6: the tap sees the method and the request's headers (the
// tollgate header, whatever case the client gave its key, read with
// MD.Get), not the body.
func TestTapSeesMethodAndHeaders(t *testing.T) {
	var (
		mu     sync.Mutex
		method string
		vals   []string
	)
	look := func(ctx context.Context, info *tap.Info) (context.Context, error) {
		mu.Lock()
		defer mu.Unlock()
		method, vals = info.FullMethodName, info.Header.Get("tollgate")
		return ctx, nil
	}
	conn, _ := factsServe(t, ok, []grpc.ServerOption{grpc.InTapHandle(look)})
	ctx := metadata.AppendToOutgoingContext(t.Context(), "Tollgate", "a=x;c=0")
	require.NoError(t, factsInvoke(ctx, conn))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "/facts.Svc/Call", method)
	require.Equal(t, []string{"a=x;c=0"}, vals)
}

// DESIGN §6: a tap's status with details reaches the client with its
// details (since v1.79); a non-status error becomes PERMISSION_DENIED.
func TestTapStatusDetailsReachClient(t *testing.T) {
	st, err := grpcstatus.New(codes.ResourceExhausted, "full").WithDetails(&errdetails.ErrorInfo{Domain: "tollgate.dev", Reason: "QUEUE_FULL"})
	require.NoError(t, err)
	refuse := func(ctx context.Context, _ *tap.Info) (context.Context, error) { return ctx, st.Err() }
	conn, n := factsServe(t, ok, []grpc.ServerOption{grpc.InTapHandle(refuse)})
	got := grpcstatus.Convert(factsInvoke(t.Context(), conn))
	require.Equal(t, codes.ResourceExhausted, got.Code())
	require.Len(t, got.Details(), 1)
	info, isInfo := got.Details()[0].(*errdetails.ErrorInfo)
	require.True(t, isInfo)
	require.Equal(t, "QUEUE_FULL", info.GetReason())
	require.Zero(t, n.Load())

	plain := func(ctx context.Context, _ *tap.Info) (context.Context, error) { return ctx, errors.New("no") }
	conn, _ = factsServe(t, ok, []grpc.ServerOption{grpc.InTapHandle(plain)})
	require.Equal(t, codes.PermissionDenied, grpcstatus.Code(factsInvoke(t.Context(), conn)))
}

// DESIGN §6: a tap cannot set trailers: grpc.SetTrailer on its context
// fails, and the refusal reaches the client without the key (so a tap
// refusal's retry-after travels in its details, not as pushback).
func TestTapCannotSetTrailers(t *testing.T) {
	errs := make(chan error, 1)
	refuse := func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		errs <- grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", "5"))
		return ctx, grpcstatus.Error(codes.ResourceExhausted, "full")
	}
	conn, _ := factsServe(t, ok, []grpc.ServerOption{grpc.InTapHandle(refuse)})
	var md metadata.MD
	require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(factsInvoke(t.Context(), conn, grpc.Trailer(&md))))
	require.Error(t, <-errs)
	require.Empty(t, md.Get("grpc-retry-pushback-ms"))
}

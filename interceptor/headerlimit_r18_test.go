package interceptor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
)

// ServerOptions bounds the header bytes a request may carry, as it bounds
// its message bytes: admission's byte bounds count messages, and grpc-go's
// own default lets each request hold 16 MiB of metadata, so a security
// review's untrusted peer held 15 MiB per queued request with the handler
// run. A request over the bound (DefaultMaxHeaderListSize, 64 KiB) is
// refused by grpc-go before any handler runs; one well under it, with a
// large credential, passes; WithMaxHeaderListSize sets the bound.
func TestR18ServerOptionsBoundHeaderBytes(t *testing.T) {
	var ran int
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		ran++
		return &testingv1.ApplyResponse{}, nil
	}}
	call := func(t *testing.T, client testingv1.TestServiceClient, bytes int) error {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-big", strings.Repeat("a", bytes))
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
		return err
	}
	t.Run("default", func(t *testing.T) {
		ran = 0
		e := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions()...)
		client := testingv1.NewTestServiceClient(e.DialT(t))
		require.NoError(t, call(t, client, 16<<10), "a 16 KiB credential passes")
		require.Equal(t, 1, ran)
		err := call(t, client, 1<<20)
		require.Error(t, err)
		require.NotEqual(t, codes.OK, grpcstatus.Code(err))
		require.Equal(t, 1, ran, "the handler ran for 1 MiB of headers")
	})
	t.Run("WithMaxHeaderListSize", func(t *testing.T) {
		ran = 0
		e := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
			interceptor.ServerOptions(interceptor.WithMaxHeaderListSize(4<<10))...)
		client := testingv1.NewTestServiceClient(e.DialT(t))
		require.Error(t, call(t, client, 16<<10))
		require.Zero(t, ran)
		require.NoError(t, call(t, client, 1<<10))
		require.Equal(t, 1, ran)
	})
	t.Run("invalid", func(t *testing.T) {
		_, err := interceptor.NewServerOptions(interceptor.WithMaxHeaderListSize(0))
		require.ErrorIs(t, err, interceptor.ErrInvalidOption)
	})
}

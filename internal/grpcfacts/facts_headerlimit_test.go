package grpcfacts

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// grpc.MaxHeaderListSize bounds a request's header list on the server
// itself, not only through the SETTINGS a well-behaved client honours: a
// client that ignores them and sends 1 MiB of headers gets no response
// headers with status 200 and grpc-status 0, and its handler never runs
// (tollgate's ServerOptions sets it, WithMaxHeaderListSize).
func TestMaxHeaderListSizeHoldsAgainstAClientIgnoringSettings(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var ran atomic.Bool
	srv := grpc.NewServer(grpc.MaxHeaderListSize(64<<10), grpc.UnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			ran.Store(true)
			return h(ctx, req)
		}))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })

	conn, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = conn.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	fr := http2.NewFramer(conn, conn)
	require.NoError(t, fr.WriteSettings())

	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: "/grpc.health.v1.Health/Check"},
		{Name: ":authority", Value: "x"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		{Name: "x-big", Value: strings.Repeat("a", 1<<20)},
	} {
		require.NoError(t, enc.WriteField(f))
	}
	// The server may close the connection while the header block is still
	// being written: that is a refusal too.
	block := hb.Bytes()
	const chunk = 16 << 10
	var werr error
	for first := true; len(block) > 0 && werr == nil; first = false {
		n := min(chunk, len(block))
		end := n == len(block)
		if first {
			werr = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:n], EndHeaders: end})
		} else {
			werr = fr.WriteContinuation(1, end, block[:n])
		}
		block = block[n:]
	}
	if werr == nil {
		// An empty request message (a HealthCheckRequest with no fields).
		werr = fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
	}
	if werr != nil {
		t.Logf("the server closed the connection while the headers were sent: %v", werr)
		require.False(t, ran.Load(), "the handler ran")
		return
	}

	// Read until the server answers stream 1 or the connection ends.
	dec := hpack.NewDecoder(4096, nil)
	var status, grpcStatus string
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break // the server closed the connection
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			fields, err := dec.DecodeFull(f.HeaderBlockFragment())
			require.NoError(t, err)
			for _, h := range fields {
				switch h.Name {
				case ":status":
					status = h.Value
				case "grpc-status":
					grpcStatus = h.Value
				}
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
		}
		if grpcStatus != "" || status != "" && status != "200" {
			break
		}
		if _, ok := f.(*http2.RSTStreamFrame); ok {
			break
		}
		if _, ok := f.(*http2.GoAwayFrame); ok {
			break
		}
	}
	t.Logf(":status %q grpc-status %q", status, grpcStatus)
	require.False(t, status == "200" && grpcStatus == "0", "the server served a request over its header list bound")
	require.False(t, ran.Load(), "the handler ran")
}

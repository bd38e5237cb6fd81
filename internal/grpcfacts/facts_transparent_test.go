package grpcfacts_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"
)

// refusingServer speaks just enough HTTP/2 to answer unary gRPC calls: once
// a stream's request is whole, it refuses the first stream with
// RST_STREAM(REFUSED_STREAM) — the server never processed it — and answers
// every later one OK with an empty message.
func refusingServer(t *testing.T, conn net.Conn, streams *atomic.Int64) {
	defer conn.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(conn, preface); err != nil {
		return
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		return
	}
	const firstStream = 1 // a client's first stream
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	block := func(fields ...string) []byte {
		hbuf.Reset()
		for i := 0; i < len(fields); i += 2 {
			_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return append([]byte(nil), hbuf.Bytes()...)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		case *http2.HeadersFrame:
			streams.Add(1)
		case *http2.DataFrame:
			// Answer once the request is whole (END_STREAM): a refusal that
			// raced the client's send would end the call in grpc-go's
			// SendMsg (io.EOF) rather than in its RecvMsg, where the
			// transparent retry is; a server refuses a stream it never
			// processed after reading it, as this one does.
			if !f.StreamEnded() {
				continue
			}
			id := f.StreamID
			if id == firstStream {
				_ = fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
				continue
			}
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true,
				BlockFragment: block(":status", "200", "content-type", "application/grpc")})
			_ = fr.WriteData(id, false, []byte{0, 0, 0, 0, 0})
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true,
				BlockFragment: block("grpc-status", "0")})
		}
	}
}

// DESIGN §6 / §3.4: grpc.WithDisableRetry() leaves grpc-go's transparent
// retry on: a stream the server refused unprocessed (REFUSED_STREAM) is
// sent again, and the call succeeds, with a client that disabled retries.
func TestTransparentRetryWithRetryDisabled(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	var streams atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := lis.Accept()
		if err != nil {
			return
		}
		refusingServer(t, c, &streams)
	}()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry())
	require.NoError(t, err)
	err = conn.Invoke(t.Context(), "/facts.Svc/Call", &emptypb.Empty{}, &emptypb.Empty{})
	_ = conn.Close()
	_ = lis.Close()
	<-done
	require.NoError(t, err, "the refused stream was retried transparently")
	require.Equal(t, int64(2), streams.Load(), "two streams: the refused one and its transparent retry")
}

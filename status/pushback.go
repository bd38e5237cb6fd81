package status

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// PushbackKey is the trailer grpc-go's own retry reads; it acts on it only in
// trailers-only responses (no header sent before the status).
const PushbackKey = "grpc-retry-pushback-ms"

// Pushback returns the value of the grpc-retry-pushback-ms trailer for a
// NOT_ADMITTED error that suggests a delay, in whole milliseconds rounded up.
// ok is false for any other error.
func Pushback(err error) (value string, ok bool) {
	if err == nil {
		return "", false
	}
	x := inspect(err)
	if k, ok := x.kind(); !ok || k != KindNotAdmitted {
		return "", false
	}
	d, ok := x.retryAfter()
	if !ok {
		return "", false
	}
	ms := d.Milliseconds()
	if d%time.Millisecond != 0 {
		ms++
	}
	return strconv.FormatInt(ms, 10), true
}

// SetPushbackTrailer sets the grpc-retry-pushback-ms trailer on a server
// call's context from a NOT_ADMITTED error that suggests a delay, and does
// nothing otherwise. It returns the error grpc.SetTrailer returns.
func SetPushbackTrailer(ctx context.Context, err error) error {
	v, ok := Pushback(err)
	if !ok {
		return nil
	}
	return grpc.SetTrailer(ctx, metadata.Pairs(PushbackKey, v))
}

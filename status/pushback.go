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

// Pushback returns the value of the grpc-retry-pushback-ms trailer for an
// error whose tollgate detail is NOT_ADMITTED: when the refusal suggests a
// delay (see [RetryAfter]), the delay in whole milliseconds, rounded up, so
// that the client never comes back early; otherwise, for a final refusal,
// "-1", which tells grpc-go's own retry not to repeat the call (gRFC A6: a
// negative pushback means "do not retry"). A final refusal that suggests a
// delay keeps it: it says that this attempt is over and a new one may
// succeed after the delay, and a plain client's repeat is a new attempt at
// a server that mints one per request. ok is false for any other error,
// nil included.
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
		if x.final() {
			return "-1", true
		}
		return "", false
	}
	ms := d.Milliseconds()
	if d%time.Millisecond != 0 {
		ms++
	}
	return strconv.FormatInt(ms, 10), true
}

// SetPushbackTrailer sets the grpc-retry-pushback-ms trailer, with the value
// [Pushback] gives, on the server call of ctx (a handler's or server
// interceptor's context) from a NOT_ADMITTED error that is final or
// suggests a delay, and
// does nothing and returns nil otherwise. grpc-go acts on the trailer only
// when no header was sent before the status. It returns the error
// grpc.SetTrailer returns (for example when ctx belongs to no server call).
func SetPushbackTrailer(ctx context.Context, err error) error {
	v, ok := Pushback(err)
	if !ok {
		return nil
	}
	return grpc.SetTrailer(ctx, metadata.Pairs(PushbackKey, v))
}

package status_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// r15Allocated is the number of bytes f allocates.
func r15Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A review asked whether Bounded, or what the fuzz target FuzzBounded
// checks of it (OutcomeOf, RetryAfter, the size of the details), costs more
// than linearly in the number or size of the details or the message's
// length: the target was seen at 0 execs/s for seconds. It does not (the
// stall is Go's fuzzing engine minimizing a new multi-KiB input, whose
// execs it reports only when the minimization ends). This guards it by
// the work done, counted as bytes allocated, for inputs of size n and 2n,
// not by the time taken: doubling the input must not much more than
// double the work.
func TestR15BoundedWorkIsLinear(t *testing.T) {
	od, err := anypb.New(&tollgatev1.OutcomeDetail{Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, Try: 2})
	require.NoError(t, err)
	zeroDelay, err := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(0)})
	require.NoError(t, err)
	debug, err := anypb.New(&errdetails.DebugInfo{Detail: strings.Repeat("d", 100)})
	require.NoError(t, err)
	details := func(d *anypb.Any) func(n int) *spb.Status {
		return func(n int) *spb.Status {
			p := &spb.Status{Code: int32(codes.ResourceExhausted), Message: "m"}
			for range n {
				p.Details = append(p.Details, d)
			}
			return p
		}
	}
	for name, mk := range map[string]func(n int) *spb.Status{
		"tiny details":         details(&anypb.Any{TypeUrl: "t"}),
		"debug details":        details(debug),
		"tollgate details":     details(od),
		"undecodable tollgate": details(&anypb.Any{TypeUrl: od.GetTypeUrl(), Value: []byte{0xff}}),
		"RetryInfos skipped":   details(zeroDelay),
		"ASCII message": func(n int) *spb.Status {
			return &spb.Status{Code: int32(codes.Internal), Message: strings.Repeat("x", 100*n)}
		},
		"escaped message": func(n int) *spb.Status {
			return &spb.Status{Code: int32(codes.Internal), Message: strings.Repeat("%é", 50*n)}
		},
		"invalid UTF-8 message": func(n int) *spb.Status {
			return &spb.Status{Code: int32(codes.Internal), Message: strings.Repeat("\xff", 100*n)}
		},
		"long type URL": func(n int) *spb.Status {
			return &spb.Status{Code: int32(codes.Internal), Details: []*anypb.Any{
				{TypeUrl: strings.Repeat("p", 100*n) + "/" + od.GetTypeUrl(), Value: od.GetValue()}}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			work := func(n int) uint64 {
				err := grpcstatus.FromProto(mk(n)).Err()
				return r15Allocated(func() {
					// What FuzzBounded does with one input.
					bounded := status.Bounded(err)
					_, _ = status.OutcomeOf(err), status.OutcomeOf(bounded)
					_, _ = status.RetryAfter(err)
					_, _ = status.RetryAfter(bounded)
					_, _ = r14bDetailsWire(err), r14bDetailsWire(bounded)
					_ = grpcMessageSize(grpcstatus.Convert(bounded).Message())
				})
			}
			small, large := work(5000), work(10000)
			t.Logf("%d bytes for n, %d for 2n", small, large)
			require.LessOrEqual(t, large, 2*small+small/2+64<<10, "the work is linear in the input")
		})
	}
}

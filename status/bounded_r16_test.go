package status_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A review asked again whether Bounded can drop the google.rpc.RetryInfo a
// peer's refusal carries (the retry-after a client backs off by) when it
// sits after a large detail, while keeping the large one. It pins, for
// every position of the tollgate OutcomeDetail and of the RetryInfo among
// large details that together far exceed the 3 KiB bound, that both are
// kept, so that the bounded error reads as the same outcome with the same
// retry-after — the RetryInfo's (7 s), not the detail's own retry_after
// (1 s), which RetryAfter reads only when there is no RetryInfo — and that
// as many of the other details as fit in what they leave are kept.
func TestR16BoundedKeepsWhatTollgateReadsWhereverItIs(t *testing.T) {
	od, err := anypb.New(&tollgatev1.OutcomeDetail{Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED,
		Reason: tollgatev1.Reason_REASON_QUEUE_FULL, AttemptId: "0190a5b2-7c3e-7def-8123-456789abcdef",
		Call: "0", Try: 1, RetryAfter: durationpb.New(time.Second), WorkloadClass: "heavy"})
	require.NoError(t, err)
	ri, err := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(7 * time.Second)})
	require.NoError(t, err)
	// Two fillers take all the room the detail leaves: without a place of
	// its own, a RetryInfo after them would be dropped.
	filler := r14bFiller(t, (3<<10-proto.Size(&spb.Status{Details: []*anypb.Any{od}}))/2)
	const fillers = 5 // more than twice the bound
	for i := 0; i <= fillers; i++ {
		for j := 0; j <= fillers+1; j++ {
			t.Run(fmt.Sprintf("detail %d, RetryInfo %d", i, j), func(t *testing.T) {
				var details []*anypb.Any
				for range fillers {
					details = append(details, filler)
				}
				details = slices.Insert(details, i, od)
				details = slices.Insert(details, j, ri)
				err := grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: "m", Details: details})
				d, ok := status.RetryAfter(err)
				require.True(t, ok)
				require.Equal(t, 7*time.Second, d, "the RetryInfo's delay")

				bounded := status.Bounded(err)
				require.LessOrEqual(t, r14bDetailsWire(bounded), 3<<10, "the details are bounded")
				d, ok = status.RetryAfter(bounded)
				require.True(t, ok, "the bound keeps the retry-after")
				require.Equal(t, 7*time.Second, d, "the RetryInfo's delay, not the detail's")
				want, got := status.OutcomeOf(err), status.OutcomeOf(bounded)
				require.Equal(t, status.KindNotAdmitted, got.Kind)
				require.Equal(t, status.ReasonQueueFull, got.Reason)
				require.True(t, proto.Equal(want.Detail, got.Detail), "the detail as it was sent")
				p, ok := status.Pushback(bounded)
				require.True(t, ok)
				require.Equal(t, "7000", p, "the pushback a plain client gets")

				// The detail and the RetryInfo as they were sent, and as
				// many of the others as fit in what they leave.
				var ods, ris, others int
				for _, k := range grpcstatus.Convert(bounded).Proto().GetDetails() {
					switch {
					case proto.Equal(k, od):
						ods++
					case proto.Equal(k, ri):
						ris++
					default:
						others++
					}
				}
				require.Equal(t, 1, ods)
				require.Equal(t, 1, ris)
				room := 3<<10 - proto.Size(&spb.Status{Details: []*anypb.Any{od, ri}})
				require.Equal(t, room/proto.Size(&spb.Status{Details: []*anypb.Any{filler}}), others)
			})
		}
	}
}

package status_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// Bounded keeps the tollgate OutcomeDetail an error is read by first and
// always, whatever its size, so that the bound never changes what the error
// reads as. A detail of that type can be as large as its writer makes it
// (a string field, or unknown fields, of a megabyte: a FAILED record
// written by a store's own writer or another build, which the server
// replays through Bounded, or any status a caller of Bounded passes), and
// it went out whole: the details were not bounded to 3 KiB, and a caller
// with an 8 KiB header list limit lost the answer to a transport INTERNAL,
// on every try, which is what the bound is for. A deciding detail too large
// for the bound is kept by what it says (its outcome, reason, final flag,
// retry_after, try and fences), its oversized strings and unknown fields
// dropped.
func TestR14cBoundedBoundsAHugeTollgateDetail(t *testing.T) {
	base := &tollgatev1.OutcomeDetail{Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED,
		Reason: tollgatev1.Reason_REASON_QUEUE_FULL, AttemptId: "0190a5b2-7c3e-7def-8123-456789abcdef", Call: "0", Try: 2,
		RetryAfter: durationpb.New(1500000000), Final: true, UnitsRemaining: 3, FencedThroughTry: 1}
	bigClass := proto.Clone(base).(*tollgatev1.OutcomeDetail)
	bigClass.WorkloadClass = strings.Repeat("c", 1<<20)
	unknown := proto.Clone(base).(*tollgatev1.OutcomeDetail)
	unknown.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), make([]byte, 1<<20)))
	for name, tc := range map[string]struct {
		d      *tollgatev1.OutcomeDetail
		prefix string
	}{
		"a huge string":       {d: bigClass},
		"huge unknown fields": {d: unknown},
		// Readers resolve a type URL by its last segment.
		"a huge type URL": {d: base, prefix: strings.Repeat("p", 1<<20) + "/"},
	} {
		t.Run(name, func(t *testing.T) {
			d := tc.d
			a, err := anypb.New(d)
			require.NoError(t, err)
			a.TypeUrl = tc.prefix + a.TypeUrl
			in := grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: "m", Details: []*anypb.Any{a}})
			out := status.Bounded(in)
			require.LessOrEqual(t, r14bDetailsWire(out), 3<<10, "the details are bounded")
			want, got := status.OutcomeOf(in), status.OutcomeOf(out)
			require.Equal(t, want.Kind, got.Kind)
			require.Equal(t, want.Reason, got.Reason)
			require.Equal(t, want.Final(), got.Final())
			require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(out))
			ra, ok := status.RetryAfter(out)
			require.True(t, ok)
			require.Equal(t, d.GetRetryAfter().AsDuration(), ra)
			require.Equal(t, base.GetAttemptId(), got.Detail.GetAttemptId(), "a string that fits is kept")
			require.Equal(t, base.GetFencedThroughTry(), got.Detail.GetFencedThroughTry())
			require.Equal(t, base.GetUnitsRemaining(), got.Detail.GetUnitsRemaining())
		})
	}
}

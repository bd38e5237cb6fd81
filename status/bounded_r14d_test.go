package status_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// r14dAny packs m, with prefix before its type URL when not empty.
func r14dAny(t *testing.T, m proto.Message, prefix string) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	require.NoError(t, err)
	a.TypeUrl = prefix + a.TypeUrl
	return a
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// Bounded keeps a status's details in their order while they fit in 3 KiB,
// after the tollgate OutcomeDetail it keeps first. A google.rpc.RetryInfo is
// what status.RetryAfter (and the client's backoff, which reads it) reads
// before the detail's own retry_after; one that sits after a large detail (a
// handler's DebugInfo, a replayed record written by another build) is
// dropped, and the bounded error suggests another delay than the one it
// was sent with, or none: a refusal's retry-after, which spreads the
// repeats of many clients, is lost exactly when the answer was large. The
// RetryInfo RetryAfter reads is now kept right after the tollgate detail,
// rebuilt by its delay when it carries more than that, and a tollgate
// detail that leaves it no room is kept by what it says.
func TestR14dBoundedKeepsTheRetryInfo(t *testing.T) {
	big := r14bFiller(t, 3<<10-8) // leaves no room for anything after it
	// fill is a detail that fits after before and leaves no room after it.
	fill := func(before ...*anypb.Any) *anypb.Any {
		return r14bFiller(t, 3<<10-8-proto.Size(&spb.Status{Details: before}))
	}
	ri := func(d time.Duration) *errdetails.RetryInfo {
		return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
	}
	od := &tollgatev1.OutcomeDetail{Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, Reason: tollgatev1.Reason_REASON_QUEUE_FULL,
		AttemptId: "0190a5b2-7c3e-7def-8123-456789abcdef", Call: "0.2.1", Try: 2, RetryAfter: durationpb.New(time.Second)}
	// A detail within the bound by itself that leaves a RetryInfo no room.
	nearlyFull := proto.Clone(od).(*tollgatev1.OutcomeDetail)
	nearlyFull.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), make([]byte, 3<<10-150)))
	padded := ri(4 * time.Second)
	padded.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), make([]byte, 1<<20)))
	for _, tc := range []struct {
		name    string
		details []*anypb.Any
		want    time.Duration
	}{
		{"no tollgate detail", []*anypb.Any{big, r14dAny(t, ri(3*time.Second), "")}, 3 * time.Second},
		{"after a large detail", []*anypb.Any{r14dAny(t, od, ""), fill(r14dAny(t, od, "")), r14dAny(t, ri(5*time.Second), "")}, 5 * time.Second},
		{"after a RetryInfo RetryAfter skips", []*anypb.Any{r14dAny(t, ri(0), ""), fill(r14dAny(t, ri(0), "")), r14dAny(t, ri(2*time.Second), "")}, 2 * time.Second},
		{"after a tollgate detail that fills the bound", []*anypb.Any{r14dAny(t, nearlyFull, ""), r14dAny(t, ri(6*time.Second), "")}, 6 * time.Second},
		{"a huge RetryInfo", []*anypb.Any{r14dAny(t, od, ""), r14dAny(t, padded, strings.Repeat("p", 1<<10)+"/")}, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: "m", Details: tc.details})
			d, ok := status.RetryAfter(err)
			require.True(t, ok)
			require.Equal(t, tc.want, d)

			bounded := status.Bounded(err)
			require.LessOrEqual(t, r14bDetailsWire(bounded), 3<<10, "the details are bounded")
			d, ok = status.RetryAfter(bounded)
			require.True(t, ok, "the bound keeps the retry-after")
			require.Equal(t, tc.want, d)
			want, got := status.OutcomeOf(err), status.OutcomeOf(bounded)
			require.Equal(t, want.Kind, got.Kind)
			require.Equal(t, want.Reason, got.Reason)
			require.Equal(t, want.Final(), got.Final())
			require.Equal(t, want.Detail.GetAttemptId(), got.Detail.GetAttemptId())
			require.Equal(t, want.Detail.GetCall(), got.Detail.GetCall())
			require.Equal(t, want.Detail.GetTry(), got.Detail.GetTry())
		})
	}
}

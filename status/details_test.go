package status_test

import (
	"errors"
	"fmt"
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

// foreignStatus is a status as a peer that mixes tollgate's details with
// others may send it: an earlier tollgate reading (OutcomeDetail, ErrorInfo,
// RetryInfo 2 s), then a QuotaFailure, another domain's ErrorInfo, a
// RetryInfo of 5 s, a BadRequest and a DebugInfo.
func foreignStatus(t testing.TB) (*grpcstatus.Status, []proto.Message) {
	t.Helper()
	kept := []proto.Message{
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "project:7", Description: "rate"}}},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount"}}},
		&errdetails.DebugInfo{Detail: "ledger write timed out"},
	}
	old := grpcstatus.Convert(status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(2*time.Second))).Proto().GetDetails()
	details := append([]*anypb.Any(nil), old...)
	for i, m := range []proto.Message{
		kept[0],
		&errdetails.ErrorInfo{Domain: "quota.example.com", Reason: "RATE_LIMITED", Metadata: map[string]string{"limit": "10"}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(5 * time.Second)},
		kept[1], kept[2],
	} {
		a, err := anypb.New(m)
		require.NoError(t, err, "detail %d", i)
		details = append(details, a)
	}
	return grpcstatus.FromProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: "quota", Details: details}), kept
}

// others is every detail of w's status that is not an OutcomeDetail, an
// ErrorInfo or a RetryInfo, in order.
func others(t testing.TB, w onWire) []proto.Message {
	t.Helper()
	var out []proto.Message
	for _, d := range w.st.Details() {
		switch d.(type) {
		case *tollgatev1.OutcomeDetail, *errdetails.ErrorInfo, *errdetails.RetryInfo:
		default:
			out = append(out, d.(proto.Message))
		}
	}
	return out
}

// A review found that a client or server that rebuilt a status error (a
// refusal re-addressed, retyped or made final) built it from tollgate's own
// details only: what else the peer or handler sent (a QuotaFailure, a
// BadRequest, another domain's ErrorInfo…) was lost. WithDetailsOf carries
// them after tollgate's own, in order, without a second OutcomeDetail,
// ErrorInfo or RetryInfo; the other domain's ErrorInfo goes into the
// metadata of tollgate's, and survives a second rebuild.
func TestWithDetailsOf(t *testing.T) {
	peer, kept := foreignStatus(t)
	refusal := status.NotAdmitted(status.ReasonNotSent, status.WithAttempt("a1", "0", 2),
		status.WithRetryAfter(time.Second), status.WithDetailsOf(peer.Err()))

	w := sendOverWire(t, refusal) // fails on a second OutcomeDetail, ErrorInfo or RetryInfo
	require.Equal(t, status.ReasonNotSent, w.detail.GetReason(), "the rebuilt detail is authoritative")
	require.Equal(t, time.Second, w.retryInfo.GetRetryDelay().AsDuration(), "tollgate's retry guidance, not the peer's")
	require.Empty(t, cmpDiff(&errdetails.ErrorInfo{Domain: status.Domain, Reason: "NOT_SENT", Metadata: map[string]string{
		"cause_domain": "quota.example.com", "cause_reason": "RATE_LIMITED", "cause_md_limit": "10",
	}}, w.errorInfo))
	got := others(t, w)
	require.Len(t, got, len(kept), "%v", got)
	for i := range kept {
		require.Empty(t, cmpDiff(kept[i], got[i]), "detail %d", i)
	}
	require.Len(t, w.st.Details(), 3+len(kept), "tollgate's three, then the peer's")

	// A second rebuild, at a server that re-addresses the unknown outcome:
	// the peer's details and its ErrorInfo's data are still there, and the
	// unknown outcome suggests no delay.
	unknown := status.With(status.OutcomeUnknown(w.st.Err()), status.WithAttempt("a1", "0.1.1", 1))
	w2 := sendOverWire(t, unknown)
	require.Equal(t, tollgatev1.Outcome_OUTCOME_UNKNOWN, w2.detail.GetOutcome())
	require.Nil(t, w2.retryInfo)
	require.Equal(t, w.errorInfo.GetMetadata(), w2.errorInfo.GetMetadata())
	require.Equal(t, "UNSPECIFIED", w2.errorInfo.GetReason())
	got = others(t, w2)
	require.Len(t, got, len(kept), "%v", got)
	for i := range kept {
		require.Empty(t, cmpDiff(kept[i], got[i]), "detail %d", i)
	}

	// Without another error (or with one that has no status) nothing follows.
	for _, err := range []error{nil, errors.New("no status")} {
		w := sendOverWire(t, status.NotAdmitted(status.ReasonShed, status.WithDetailsOf(err)))
		require.Len(t, w.st.Details(), 2)
		require.Empty(t, w.errorInfo.GetMetadata())
	}
}

// A review found that a rebuilt status carried every detail of the other
// error, and every entry of its ErrorInfo's metadata, however large: a
// callee's (or handler's) 64 KiB DebugInfo or a 10,000-entry ErrorInfo went
// on up every hop, where a caller whose header list limit is below the
// callee's (grpc-java's and gRPC C++'s 8 KiB default) lost the whole answer,
// refusal and all. What is carried is bounded: a detail that does not fit
// is dropped, later ones that fit are kept in order, and the ErrorInfo
// keeps its domain, reason and the entries that fit by key order, the same
// at every hop.
func TestWithDetailsOfIsBounded(t *testing.T) {
	md := make(map[string]string, 10000)
	for i := range 10000 {
		md[fmt.Sprintf("k%05d", i)] = strings.Repeat("v", 20)
	}
	var details []*anypb.Any
	for i, m := range []proto.Message{
		&errdetails.DebugInfo{Detail: strings.Repeat("stack frame\n", 64<<10/12)},
		&errdetails.ErrorInfo{Domain: "quota.example.com", Reason: "RATE_LIMITED", Metadata: md},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "project:7"}}},
	} {
		a, err := anypb.New(m)
		require.NoError(t, err, "detail %d", i)
		details = append(details, a)
	}
	peer := grpcstatus.FromProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: "quota", Details: details})

	refusal := status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second), status.WithDetailsOf(peer.Err()))
	b, err := proto.Marshal(grpcstatus.Convert(refusal).Proto())
	require.NoError(t, err)
	require.Less(t, len(b), 4<<10, "the rebuilt status is bounded")
	w := sendOverWire(t, refusal)
	got := others(t, w)
	require.Len(t, got, 1, "the DebugInfo does not fit, the QuotaFailure after it does: %v", got)
	require.Empty(t, cmpDiff(details[2], mustAny(t, got[0])))
	cause := w.errorInfo.GetMetadata()
	require.Equal(t, "quota.example.com", cause["cause_domain"])
	require.Equal(t, "RATE_LIMITED", cause["cause_reason"])
	require.Equal(t, md["k00000"], cause["cause_md_k00000"], "the entries that fit, by key order")
	require.Less(t, len(cause), 100)

	// A second hop keeps the same entries.
	w2 := sendOverWire(t, status.OutcomeUnknown(w.st.Err()))
	require.Equal(t, cause, w2.errorInfo.GetMetadata())
	require.Len(t, others(t, w2), 1)
}

// A review found that the entries tollgate's ErrorInfo took from another
// domain's were named cause_md_ and the other's key whatever that key was:
// a 60-character key made a 69-character one, and a key such as
// "limit.per.sec" one with a dot, where AIP-193 wants metadata keys to match
// [a-z][a-zA-Z0-9-_]+ and be at most 64 characters. An entry whose carried
// key would not be one is dropped; the others are kept.
func TestWithDetailsOfKeepsAIP193Keys(t *testing.T) {
	long := strings.Repeat("k", 60)
	peer := grpcstatus.FromProto(&spb.Status{Code: int32(codes.ResourceExhausted), Details: []*anypb.Any{mustAny(t, &errdetails.ErrorInfo{
		Domain: "quota.example.com", Reason: "RATE_LIMITED",
		Metadata: map[string]string{"limit": "10", "limit.per.sec": "2", long: "x", "Zone": "eu", "cause_x": "y"},
	})}})
	w := sendOverWire(t, status.NotAdmitted(status.ReasonQueueFull, status.WithDetailsOf(peer.Err())))
	require.Equal(t, map[string]string{
		"cause_domain": "quota.example.com", "cause_reason": "RATE_LIMITED",
		"cause_md_limit": "10", "cause_md_Zone": "eu", "cause_md_cause_x": "y",
	}, w.errorInfo.GetMetadata())
}

func mustAny(t testing.TB, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	require.NoError(t, err)
	return a
}

// FuzzDetailsOf rebuilds a refusal from an arbitrary google.rpc.Status, as a
// client or server rebuilds one a peer sent: whatever the peer's details,
// the refusal carries one OutcomeDetail (its own), one ErrorInfo
// (tollgate's), one RetryInfo (its own delay), then every other detail of
// the peer's that fits in the bound of what it carries, in order.
func FuzzDetailsOf(f *testing.F) {
	peer, _ := foreignStatus(f)
	for _, s := range []*spb.Status{peer.Proto(), grpcstatus.Convert(status.OutcomeUnknown(peer.Err())).Proto(), {Code: 2}} {
		b, err := proto.Marshal(s)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p spb.Status
		if proto.Unmarshal(b, &p) != nil || p.GetCode() == 0 {
			t.Skip()
		}
		var want []*anypb.Any
		room := 3 << 10 // what a rebuilt status carries at most (TestWithDetailsOfIsBounded)
		for _, d := range p.GetDetails() {
			switch d.MessageName() {
			case "tollgate.v1.OutcomeDetail", "google.rpc.ErrorInfo", "google.rpc.RetryInfo":
			default:
				// As sent in the status: the encoded Any, framed.
				if size := 1 + protowire.SizeBytes(proto.Size(d)); size <= room {
					room -= size
					want = append(want, d)
				}
			}
		}
		refusal := status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second),
			status.WithDetailsOf(grpcstatus.FromProto(&p).Err()))
		wire, err := proto.Marshal(grpcstatus.Convert(refusal).Proto())
		require.NoError(t, err)
		var q spb.Status
		require.NoError(t, proto.Unmarshal(wire, &q))
		got := q.GetDetails()
		require.Len(t, got, 3+len(want))
		st := grpcstatus.FromProto(&q)
		o := status.OutcomeOf(st.Err())
		require.Equal(t, status.KindNotAdmitted, o.Kind)
		require.Equal(t, status.ReasonQueueFull, o.Reason)
		ra, ok := status.RetryAfter(st.Err())
		require.True(t, ok)
		require.Equal(t, time.Second, ra)
		ei := new(errdetails.ErrorInfo)
		require.NoError(t, got[1].UnmarshalTo(ei))
		require.Equal(t, status.Domain, ei.GetDomain())
		require.Equal(t, "QUEUE_FULL", ei.GetReason())
		size := 0
		for k, v := range ei.GetMetadata() {
			require.Regexp(t, `^cause_[a-zA-Z0-9_-]*$`, k, "an AIP-193 key of the cause")
			require.LessOrEqual(t, len(k), 64)
			size += len(k) + len(v)
		}
		require.LessOrEqual(t, size, 512, "the cause entries are bounded")
		for i, d := range want {
			require.True(t, proto.Equal(d, got[3+i]), "detail %d: want %v, got %v", i, d, got[3+i])
		}
	})
}

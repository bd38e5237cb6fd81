package status_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// 76399a3 leaves an UNKNOWN outcome's cause's ErrorInfo and RetryInfo out
// of its status (AIP-193: one ErrorInfo; a RetryInfo "would invite generic
// clients to repeat what may have taken effect"), but causeDetails compares
// each detail's type URL with the exact string
// "type.googleapis.com/google.rpc.ErrorInfo" (…RetryInfo). A google.protobuf.Any
// names its type by whatever follows the URL's last '/' (anypb.MessageName,
// which grpc-go's Status.Details and every AIP-193 reader resolve by): a
// callee that packs with another prefix (Java's Any.pack(msg, prefix), C++
// PackFrom(msg, prefix), or a hostile peer) gets its ErrorInfo and
// RetryInfo through. The status then carries two ErrorInfos — the reader
// that keeps the last one (gax-go apierror) reports the callee's reason and
// domain, not tollgate's (DESIGN.md §2.4) — and a RetryInfo that
// status.RetryAfter itself reads back after the status crossed the wire.
func TestRegression15StatusTypeURL(t *testing.T) {
	ei, err := anypb.New(&errdetails.ErrorInfo{Domain: "inventory.example.com", Reason: "STOCK_CONFLICT"})
	require.NoError(t, err)
	ri, err := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)})
	require.NoError(t, err)
	for _, a := range []*anypb.Any{ei, ri} {
		a.TypeUrl = "types.example.com/" + string(a.MessageName())
	}
	callee := grpcstatus.FromProto(&spb.Status{Code: int32(codes.Aborted), Message: "callee: conflict",
		Details: []*anypb.Any{ei, ri}})
	unknown := status.OutcomeUnknown(callee.Err(), status.WithAttempt("a1", "0", 1), status.WithReason(status.ReasonCallLost))

	// As the caller reads it: the status crossed the wire.
	b, err := proto.Marshal(grpcstatus.Convert(unknown).Proto())
	require.NoError(t, err)
	var p spb.Status
	require.NoError(t, proto.Unmarshal(b, &p))
	received := grpcstatus.FromProto(&p)

	var infos []*errdetails.ErrorInfo
	var retries []*errdetails.RetryInfo
	for _, d := range received.Details() {
		switch v := d.(type) {
		case *errdetails.ErrorInfo:
			infos = append(infos, v)
		case *errdetails.RetryInfo:
			retries = append(retries, v)
		}
	}
	require.Equal(t, status.KindUnknown, status.OutcomeOf(received.Err()).Kind)
	require.Len(t, infos, 1, "the UNKNOWN status carries %d ErrorInfos: %v", len(infos), infos)
	require.Empty(t, retries, "the UNKNOWN status carries its cause's RetryInfo: %v", retries)
	ra, ok := status.RetryAfter(received.Err())
	require.False(t, ok, "status.RetryAfter reads the cause's RetryInfo %v from an UNKNOWN outcome", ra)
}

// FuzzRegression15UnknownCause wraps an arbitrary google.rpc.Status, as a callee
// sent it, in an UNKNOWN outcome and checks what 76399a3 promises of the
// result: tollgate's own detail decides, one ErrorInfo (tollgate's), no
// RetryInfo, no delay read back.
func FuzzRegression15UnknownCause(f *testing.F) {
	ei, _ := anypb.New(&errdetails.ErrorInfo{Domain: "inventory.example.com", Reason: "STOCK_CONFLICT"})
	ri, _ := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)})
	for _, s := range []*spb.Status{
		{Code: int32(codes.Aborted), Message: "x", Details: []*anypb.Any{ei, ri}},
		grpcstatus.Convert(status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second))).Proto(),
	} {
		b, _ := proto.Marshal(s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p spb.Status
		if proto.Unmarshal(b, &p) != nil || p.GetCode() == 0 {
			t.Skip()
		}
		unknown := status.OutcomeUnknown(grpcstatus.FromProto(&p).Err(), status.WithReason(status.ReasonCallLost))
		wire, err := proto.Marshal(grpcstatus.Convert(unknown).Proto())
		if err != nil {
			t.Skip()
		}
		var q spb.Status
		if err := proto.Unmarshal(wire, &q); err != nil {
			t.Fatal(err)
		}
		received := grpcstatus.FromProto(&q).Err()
		o := status.OutcomeOf(received)
		if o.Kind != status.KindUnknown || o.Reason != status.ReasonCallLost {
			t.Fatalf("UNKNOWN(CALL_LOST) reads %v %v", o.Kind, o.Reason)
		}
		infos, retries := 0, 0
		for _, d := range grpcstatus.Convert(received).Details() {
			switch d.(type) {
			case *errdetails.ErrorInfo:
				infos++
			case *errdetails.RetryInfo:
				retries++
			}
		}
		if infos != 1 || retries != 0 {
			t.Fatalf("%d ErrorInfos and %d RetryInfos in %v", infos, retries, q.GetDetails())
		}
		if ra, ok := status.RetryAfter(received); ok {
			t.Fatalf("RetryAfter %v", ra)
		}
	})
}

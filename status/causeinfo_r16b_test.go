package status_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// r16bCause is the cause_ entries of the tollgate ErrorInfo of an outcome
// rebuilt from err (an unknown outcome whose cause it is): what an
// outcome carries, hop after hop, of err's google.rpc.ErrorInfo.
func r16bCause(t *testing.T, err error) map[string]string {
	t.Helper()
	for _, d := range grpcstatus.Convert(status.OutcomeUnknown(err)).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == status.Domain {
			cause := map[string]string{}
			for k, v := range ei.GetMetadata() {
				if strings.HasPrefix(k, "cause_") {
					cause[k] = v
				}
			}
			return cause
		}
	}
	t.Fatal("no tollgate ErrorInfo")
	return nil
}

// r16bErrorInfos is the google.rpc.ErrorInfos of err's status, decoded.
func r16bErrorInfos(err error) []*errdetails.ErrorInfo {
	var eis []*errdetails.ErrorInfo
	for _, d := range grpcstatus.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			eis = append(eis, ei)
		}
	}
	return eis
}

// A review found that Bounded, which keeps a handler's definite error's
// tollgate detail and RetryInfo before any other detail, keeps its
// google.rpc.ErrorInfo only while it fits after the details ahead of it:
// one that sits after large details is dropped, though it is the error's
// machine-readable reason (AIP-193) and the one detail an outcome rebuilt
// from the error reads into its own ErrorInfo's cause_ entries, which go on
// up every hop (carriedDetails) — the caller's record of why the call
// below failed is lost to a debug dump. The ErrorInfo that an outcome
// reads (the first that gives cause_ entries) is kept before the other
// details, wherever it sits, another domain's and a tollgate one's that
// carries its own cause alike; a second ErrorInfo is one more detail.
func TestR16bBoundedKeepsTheErrorInfoAnOutcomeReads(t *testing.T) {
	for _, ei := range []*errdetails.ErrorInfo{
		{Domain: "example.com", Reason: "STOCK_EXHAUSTED", Metadata: map[string]string{"sku": "A-17", "warehouse": "fra"}},
		{Domain: status.Domain, Reason: "QUEUE_FULL", Metadata: map[string]string{"cause_domain": "example.com", "cause_reason": "STOCK_EXHAUSTED", "cause_md_sku": "A-17"}},
	} {
		info, err := anypb.New(ei)
		require.NoError(t, err)
		// Too large to fit beside the ErrorInfo and a filler.
		second, err := anypb.New(&errdetails.ErrorInfo{Domain: "example.org", Reason: "OTHER", Metadata: map[string]string{"k": strings.Repeat("v", 2<<10)}})
		require.NoError(t, err)
		// Two fillers leave no room for the ErrorInfo; it leaves room for
		// one.
		filler := r14bFiller(t, (3<<10-proto.Size(&spb.Status{Details: []*anypb.Any{info}}))/2+16)
		const fillers = 5 // more than twice the bound
		for i := 0; i <= fillers; i++ {
			t.Run(fmt.Sprintf("%s at %d", ei.GetDomain(), i), func(t *testing.T) {
				var details []*anypb.Any
				for range fillers {
					details = append(details, filler)
				}
				details = slices.Insert(details, i, info)
				details = append(details, second) // after it: not the one read
				err := grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.FailedPrecondition), Message: "m", Details: details})
				want := r16bCause(t, err)
				require.NotEmpty(t, want)

				bounded := status.Bounded(err)
				require.LessOrEqual(t, r14bDetailsWire(bounded), 3<<10, "the details are bounded")
				eis := r16bErrorInfos(bounded)
				require.Len(t, eis, 1, "the first, not the second")
				require.True(t, proto.Equal(ei, eis[0]), "the ErrorInfo as it was sent: %v", eis[0])
				require.Equal(t, want, r16bCause(t, bounded), "what an outcome carries of it")
				others := len(grpcstatus.Convert(bounded).Details()) - 1
				require.Equal(t, 1, others, "as many others as fit in what it leaves")
			})
		}
	}
}

// An ErrorInfo too large for the bound by itself is kept by what an outcome
// reads of it: its domain and reason, and the metadata entries that give
// the outcome's cause_ entries (at most 512 bytes, in the order of their
// keys), so the bound does not change what goes on up.
func TestR16bBoundedKeepsAHugeErrorInfoByWhatAnOutcomeReads(t *testing.T) {
	md := map[string]string{}
	for i := range 40 {
		md[fmt.Sprintf("k%02d", i)] = strings.Repeat("v", 100)
	}
	info, err := anypb.New(&errdetails.ErrorInfo{Domain: "example.com", Reason: "BIG", Metadata: md})
	require.NoError(t, err)
	require.Greater(t, proto.Size(&spb.Status{Details: []*anypb.Any{info}}), 3<<10)
	err = grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.FailedPrecondition), Message: "m",
		Details: []*anypb.Any{r14bFiller(t, 1<<10), info}})
	want := r16bCause(t, err)
	require.Equal(t, "example.com", want["cause_domain"])
	require.Equal(t, "BIG", want["cause_reason"])
	require.Contains(t, want, "cause_md_k00")

	bounded := status.Bounded(err)
	require.LessOrEqual(t, r14bDetailsWire(bounded), 3<<10, "the details are bounded")
	eis := r16bErrorInfos(bounded)
	require.Len(t, eis, 1)
	require.Equal(t, "example.com", eis[0].GetDomain())
	require.Equal(t, "BIG", eis[0].GetReason())
	require.Equal(t, want, r16bCause(t, bounded), "what an outcome carries of it")
}

// FuzzR16bBoundedKeepsTheCause bounds arbitrary google.rpc.Status bytes,
// as FuzzBounded does, and checks that an outcome rebuilt from the bounded
// error carries the same cause_ entries as one rebuilt from the error
// itself whenever the details Bounded keeps first — the tollgate details,
// the RetryInfos and the ErrorInfos, all of them — fit the bound together.
func FuzzR16bBoundedKeepsTheCause(f *testing.F) {
	info, err := anypb.New(&errdetails.ErrorInfo{Domain: "example.com", Reason: "R", Metadata: map[string]string{"a": "1"}})
	require.NoError(f, err)
	big := r14bFiller(f, 3<<10-8)
	for _, p := range []*spb.Status{
		{Code: int32(codes.FailedPrecondition), Message: "m", Details: []*anypb.Any{big, info}},
		{Code: int32(codes.FailedPrecondition), Message: strings.Repeat("x", 2000), Details: []*anypb.Any{info, big, info}},
		grpcstatus.Convert(status.OutcomeUnknown(grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.Internal), Message: "m", Details: []*anypb.Any{big, info}}))).Proto(),
	} {
		b, err := proto.Marshal(p)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p spb.Status
		if proto.Unmarshal(b, &p) != nil || p.GetCode() == 0 {
			t.Skip()
		}
		var first []*anypb.Any
		for _, d := range p.GetDetails() {
			switch d.MessageName() {
			case "tollgate.v1.OutcomeDetail", "google.rpc.RetryInfo", "google.rpc.ErrorInfo":
				first = append(first, d)
			}
		}
		if proto.Size(&spb.Status{Details: first}) > 3<<10 {
			t.Skip()
		}
		err := grpcstatus.FromProto(&p).Err()
		bounded := status.Bounded(err)
		require.LessOrEqual(t, r14bDetailsWire(bounded), 3<<10)
		require.Equal(t, r16bCause(t, err), r16bCause(t, bounded))
	})
}

// Looking for the ErrorInfo an outcome reads keeps Bounded's work linear
// in the details (as TestR15BoundedWorkIsLinear guards it): many
// ErrorInfos that give no cause_ entries (tollgate's own, with metadata to
// sort), or that do not decode, are each looked at once.
func TestR16bBoundedWorkIsLinearWithErrorInfos(t *testing.T) {
	md := map[string]string{}
	for i := range 20 {
		md[fmt.Sprintf("k%02d", i)] = "v"
	}
	own, err := anypb.New(&errdetails.ErrorInfo{Domain: status.Domain, Reason: "QUEUE_FULL", Metadata: md})
	require.NoError(t, err)
	info, err := anypb.New(&errdetails.ErrorInfo{Domain: "example.com", Reason: "R", Metadata: md})
	require.NoError(t, err)
	for name, d := range map[string]*anypb.Any{
		"tollgate ErrorInfos": own,
		"undecodable":         {TypeUrl: own.GetTypeUrl(), Value: []byte{0xff}},
		"ErrorInfos read":     info,
	} {
		t.Run(name, func(t *testing.T) {
			work := func(n int) uint64 {
				p := &spb.Status{Code: int32(codes.FailedPrecondition), Message: "m"}
				for range n {
					p.Details = append(p.Details, d)
				}
				err := grpcstatus.FromProto(p).Err()
				return r15Allocated(func() {
					bounded := status.Bounded(err)
					_ = r14bDetailsWire(bounded)
				})
			}
			small, large := work(5000), work(10000)
			t.Logf("%d bytes for n, %d for 2n", small, large)
			require.LessOrEqual(t, large, 2*small+small/2+64<<10, "the work is linear in the input")
		})
	}
}

package status_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// A review found that when Bounded cannot keep the google.rpc.ErrorInfo an
// outcome reads its cause_ entries from (even rebuilt, it does not fit in
// what the tollgate detail and the RetryInfo leave), it still keeps a later
// ErrorInfo that gives entries as one more detail: an outcome rebuilt from
// the bounded error then reads that one, and carries up a cause the error
// never had (another domain, another reason). Bounding may lose the cause;
// it must not swap it for another.
func TestR16revBoundedNeverSwapsTheCause(t *testing.T) {
	mk := func(m *errdetails.ErrorInfo) *anypb.Any {
		a, err := anypb.New(m)
		require.NoError(t, err)
		return a
	}
	md := map[string]string{}
	for _, k := range []string{"a", "b", "c"} {
		md[k] = strings.Repeat("v", 150)
	}
	od, err := anypb.New(&tollgatev1.OutcomeDetail{Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED,
		Reason: tollgatev1.Reason_REASON_SHED, WorkloadClass: strings.Repeat("c", 2800)})
	require.NoError(t, err)
	later := mk(&errdetails.ErrorInfo{Domain: "other.example", Reason: "NOT_THE_CAUSE"})
	for name, details := range map[string][]*anypb.Any{
		// The first ErrorInfo's domain is too long to be read (cause_domain
		// is skipped), but its reason and metadata give the cause; rebuilt,
		// it keeps the domain and exceeds the bound.
		"huge domain": {mk(&errdetails.ErrorInfo{Domain: strings.Repeat("d", 4<<10), Reason: "STOCK_EXHAUSTED", Metadata: map[string]string{"sku": "A-17"}}), later},
		// A large tollgate detail that fits leaves too little room for it.
		"large tollgate detail": {od, mk(&errdetails.ErrorInfo{Domain: "example.com", Reason: "STOCK_EXHAUSTED", Metadata: md}), later},
	} {
		t.Run(name, func(t *testing.T) {
			err := grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.FailedPrecondition), Message: "m", Details: details})
			want := r16bCause(t, err)
			require.Equal(t, "STOCK_EXHAUSTED", want["cause_reason"])

			bounded := status.Bounded(err)
			require.LessOrEqual(t, r14bDetailsWire(bounded), 3<<10, "the details are bounded")
			got := r16bCause(t, bounded)
			if len(got) > 0 {
				require.Equal(t, want, got, "the cause read from the bounded error is the error's, or none")
			}
		})
	}
}

// FuzzR16revBoundedCauseIsTheErrorsOrNone bounds arbitrary google.rpc.Status
// bytes and checks, whatever fits, that an outcome rebuilt from the bounded
// error carries the error's cause_ entries or none, never others; and that
// the details stay within the bound.
func FuzzR16revBoundedCauseIsTheErrorsOrNone(f *testing.F) {
	for _, ei := range []*errdetails.ErrorInfo{
		{Domain: strings.Repeat("d", 4<<10), Reason: "R", Metadata: map[string]string{"sku": "A"}},
		{Domain: "example.com", Reason: "R", Metadata: map[string]string{"a": strings.Repeat("v", 400)}},
		{Domain: status.Domain, Reason: strings.Repeat("r", 4<<10), Metadata: map[string]string{"cause_reason": "X"}},
	} {
		a, err := anypb.New(ei)
		require.NoError(f, err)
		later, err := anypb.New(&errdetails.ErrorInfo{Domain: "b", Reason: "B"})
		require.NoError(f, err)
		b, err := proto.Marshal(&spb.Status{Code: 9, Message: "m", Details: []*anypb.Any{r14bFiller(f, 2900), a, later}})
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p spb.Status
		if proto.Unmarshal(b, &p) != nil || p.GetCode() == 0 {
			t.Skip()
		}
		err := grpcstatus.FromProto(&p).Err()
		bounded := status.Bounded(err)
		require.LessOrEqual(t, r14bDetailsWire(bounded), 3<<10)
		if got := r16bCause(t, bounded); len(got) > 0 {
			require.Equal(t, r16bCause(t, err), got)
		}
	})
}

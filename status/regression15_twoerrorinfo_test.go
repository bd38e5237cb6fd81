package status_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found that 186311c appended an UNKNOWN outcome's cause's details after tollgate's
// own, filtering only tollgate-domain ErrorInfos. A callee's own ErrorInfo
// (another domain) then follows tollgate's: the status carries two
// google.rpc.ErrorInfo messages. AIP-193 ("Uniqueness": each type of detail
// payload must be included at most once; there must not be more than one
// ErrorInfo) forbids it, and readers built on it keep one ErrorInfo per
// status — gax-go's apierror keeps the last one it sees — so they report the
// callee's reason and domain instead of tollgate's (DESIGN.md §2.4: the
// ErrorInfo of an unresolved outcome has domain tollgate.dev and the
// tollgate reason).
func TestRegression15StatusUnknownTwoErrorInfo(t *testing.T) {
	callee, err := grpcstatus.New(codes.Aborted, "callee: conflict").WithDetails(
		&errdetails.ErrorInfo{Domain: "inventory.example.com", Reason: "STOCK_CONFLICT"})
	require.NoError(t, err)
	unknown := status.OutcomeUnknown(callee.Err(), status.WithAttempt("a1", "0", 1), status.WithReason(status.ReasonCallLost))

	st := grpcstatus.Convert(unknown)
	var infos []*errdetails.ErrorInfo
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			infos = append(infos, ei)
		}
	}
	require.NotEmpty(t, infos)
	// What an AIP-193 reader (gax-go apierror: the last ErrorInfo wins) sees.
	last := infos[len(infos)-1]
	require.Equal(t, status.Domain, last.GetDomain(), "the ErrorInfo a one-per-type reader keeps is the callee's: %v", last)
	require.Len(t, infos, 1, "the status carries %d ErrorInfos: %v", len(infos), infos)
}

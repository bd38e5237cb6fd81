package interceptor

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/status"
)

// A refusal whose reason this build does not know (a number past the enum,
// or a negative one) is labelled as ReasonName names it, UNSPECIFIED: it
// is not a cancellation or an abandoned lease, which only a refusal with
// no reason at all is.
func TestR18RefusalReasonOfUnknownReasonIsUnspecified(t *testing.T) {
	for _, r := range []status.Reason{64, 65, 1000, -1} {
		for _, kind := range []status.Kind{status.KindNotAdmitted, status.KindUnknown} {
			_, name := refusalReason(status.Outcome{Kind: kind, Reason: r})
			require.Equal(t, "UNSPECIFIED", name, "reason %d kind %v", r, kind)
		}
	}
	_, name := refusalReason(status.Outcome{Kind: status.KindNotAdmitted})
	require.Equal(t, "CANCELLED", name)
	_, name = refusalReason(status.Outcome{Kind: status.KindUnknown})
	require.Equal(t, "ABANDONED", name)
	_, name = refusalReason(status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonStoreUnavailable})
	require.Equal(t, "STORE_UNAVAILABLE", name)
}

package status_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// r15PeerRefusal is a refusal as a peer may send it: a NOT_ADMITTED
// OutcomeDetail with the given strings, as the client receives it.
func r15PeerRefusal(t *testing.T, attemptID, call, class string) error {
	t.Helper()
	a, err := anypb.New(&tollgatev1.OutcomeDetail{Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED,
		Reason: tollgatev1.Reason_REASON_QUEUE_FULL, AttemptId: attemptID, Call: call, Try: 2,
		WorkloadClass: class, RetryAfter: durationpb.New(time.Second), UnitsRemaining: 3, FencedThroughTry: 1})
	require.NoError(t, err)
	return grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: "m", Details: []*anypb.Any{a}})
}

// A review found this defect (the text is the review's account of the
// code before the fix).
//
// The Outcome that OutcomeOf, OutcomeOfCall and HandlerOutcome return for
// a status received from a peer carries the peer's OutcomeDetail as it
// decoded: its attempt ID, call key and class are whatever the peer sent.
// A peer's status can be as large as the client's header list limit
// (grpc-go's default is 16 MiB), so a hostile or broken peer makes every
// reading of the error copy a megabyte attempt ID, and the client puts the
// class on its call span (tollgate.class) as it came, to be exported.
// DESIGN.md §2.1 bounds what a tollgate peer can send for them: an attempt
// ID of at most 64 characters, a call key of at most 128; Fields bounds a
// class to 256 bytes. An identifier beyond its bound is now read as "…"
// (which names no attempt or call, and compares unequal to every
// identifier and to "", as the long one did, so nothing reads differently),
// and a class beyond 256 bytes is dropped, as Fields drops it.
func TestR15OutcomeBoundsAPeersIdentifiers(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	err := r15PeerRefusal(t, huge, huge, huge)
	for name, o := range map[string]status.Outcome{
		"OutcomeOf":      status.OutcomeOf(err),
		"OutcomeOfCall":  status.OutcomeOfCall(err, status.PeerStatus),
		"HandlerOutcome": status.HandlerOutcome(status.WithoutEffect(err), false),
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, status.KindNotAdmitted, o.Kind)
			d := o.Detail
			require.LessOrEqual(t, len(d.GetAttemptId()), 64, "an attempt ID over 64 bytes is not kept")
			require.LessOrEqual(t, len(d.GetCall()), 128, "a call key over 128 bytes is not kept")
			require.Empty(t, len(d.GetWorkloadClass()), "a class over 256 bytes is dropped")
			require.Equal(t, "…", d.GetAttemptId())
			require.Equal(t, "…", d.GetCall())
			require.Equal(t, uint32(2), d.GetTry(), "the rest is kept")
			require.Equal(t, time.Second, d.GetRetryAfter().AsDuration())
			require.Equal(t, int64(3), d.GetUnitsRemaining())
			require.Equal(t, uint32(1), d.GetFencedThroughTry())
		})
	}

	// At their bounds they are kept as sent.
	id, call, class := strings.Repeat("a", 64), strings.Repeat("c", 128), strings.Repeat("k", 256)
	d := status.OutcomeOf(r15PeerRefusal(t, id, call, class)).Detail
	require.Equal(t, id, d.GetAttemptId())
	require.Equal(t, call, d.GetCall())
	require.Equal(t, class, d.GetWorkloadClass())
	d = status.OutcomeOf(r15PeerRefusal(t, id+"a", call+"c", class+"k")).Detail
	require.Equal(t, "…", d.GetAttemptId())
	require.Equal(t, "…", d.GetCall())
	require.Empty(t, d.GetWorkloadClass())
}

// A review found this defect (the text is the review's account of the
// code before the fix).
//
// Fields drops a class over 256 bytes, but keeps an attempt ID and a call
// key of any length: an outcome built with a peer's or a caller's
// megabyte identifier carried it in its detail, on the wire, past the
// bound on what a status sends. They are now bounded as a received
// detail's are (TestR15OutcomeBoundsAPeersIdentifiers), so that an outcome
// reads the same before and after it crosses the wire.
func TestR15FieldsBoundIdentifiers(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	for _, err := range []error{
		status.NotAdmitted(status.ReasonQueueFull, status.Fields{AttemptID: huge, Call: huge, Try: 2}),
		status.NotAdmitted(status.ReasonQueueFull, status.WithAttempt(huge, huge, 2)),
	} {
		local := status.OutcomeOf(err).Detail
		require.LessOrEqual(t, len(local.GetAttemptId()), 64, "an attempt ID over 64 bytes is not kept")
		require.LessOrEqual(t, len(local.GetCall()), 128, "a call key over 128 bytes is not kept")
		require.Equal(t, "…", local.GetAttemptId())
		require.Equal(t, "…", local.GetCall())
		require.Equal(t, uint32(2), local.GetTry())
		wire := status.OutcomeOf(grpcstatus.Convert(err).Err()).Detail
		require.Equal(t, local.GetAttemptId(), wire.GetAttemptId(), "the same across the wire")
		require.Equal(t, local.GetCall(), wire.GetCall())
	}
	id, call := strings.Repeat("a", 64), strings.Repeat("c", 128)
	d := status.OutcomeOf(status.NotAdmitted(status.ReasonQueueFull, status.WithAttempt(id, call, 1))).Detail
	require.Equal(t, id, d.GetAttemptId(), "within the bound, kept")
	require.Equal(t, call, d.GetCall())

	// Within the bound, but not once invalid UTF-8 is repaired (each run of
	// bad bytes becomes the 3 bytes of U+FFFD): bounded as the reader reads
	// it.
	bad := status.NotAdmitted(status.ReasonQueueFull, status.WithAttempt(strings.Repeat("\xffa", 32), strings.Repeat("\xfec", 64), 1))
	local, wire := status.OutcomeOf(bad).Detail, status.OutcomeOf(grpcstatus.Convert(bad).Err()).Detail
	require.Equal(t, "…", local.GetAttemptId())
	require.Equal(t, "…", local.GetCall())
	require.Equal(t, local.GetAttemptId(), wire.GetAttemptId())
	require.Equal(t, local.GetCall(), wire.GetCall())
	bad = status.NotAdmitted(status.ReasonQueueFull, status.WithClass(strings.Repeat("\xffk", 128)))
	local, wire = status.OutcomeOf(bad).Detail, status.OutcomeOf(grpcstatus.Convert(bad).Err()).Detail
	require.Empty(t, local.GetWorkloadClass(), "a class over 256 bytes once repaired is dropped")
	require.Equal(t, local.GetWorkloadClass(), wire.GetWorkloadClass())
}

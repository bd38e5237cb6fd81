package status_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A user found that status.With dropped status.WithoutEffect: a handler that
// named the refusal it returned (With(WithoutEffect(na), WithMessage(…)))
// turned a repeatable refusal into UNKNOWN, although WithoutEffect's doc
// says it changes nothing else. It also dropped a fmt.Errorf prefix, which
// grpc-go sends as the status message of the wrapped error.
func TestWithKeepsWithoutEffectAndTheWrappersText_r18s(t *testing.T) {
	na := status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second))

	named := status.With(status.WithoutEffect(na), status.WithMessage("while reserving stock"))
	o := status.HandlerOutcome(named, false)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "With dropped WithoutEffect")
	require.Equal(t, status.ReasonQueueFull, o.Reason)
	require.Equal(t, "tollgate: not admitted: queue full: while reserving stock", named.Error())

	// A WithoutEffect under a fmt.Errorf wrapper is kept too, with its text.
	named = status.With(fmt.Errorf("reserve: %w", status.WithoutEffect(na)), status.WithAttempt("a", "0", 1))
	require.Equal(t, status.KindNotAdmitted, status.HandlerOutcome(named, false).Kind)

	// Over gRPC, a handler's With of a wrapped refusal says what the
	// wrapped refusal said (grpc-go sends err.Error() for a wrapped
	// status), and what With adds.
	wrapped := fmt.Errorf("reserve: %w", na)
	conn := startServer(t, map[string]func(context.Context) error{
		"Plain": func(context.Context) error { return wrapped },
		"With":  func(context.Context) error { return status.With(wrapped, status.WithAttempt("a", "0", 1)) },
	})
	var md metadata.MD
	plain := grpcstatus.Convert(invoke(conn, "Plain", &md))
	with := grpcstatus.Convert(invoke(conn, "With", &md))
	require.Equal(t, "reserve: tollgate: not admitted: queue full", plain.Message())
	require.Equal(t, plain.Message(), with.Message(), "With dropped the wrapper's text")
	require.Equal(t, "a", status.OutcomeOf(with.Err()).Detail.GetAttemptId())
	require.Equal(t, codes.ResourceExhausted, with.Code())

	// Without a wrapper, With's message is the original's, as before.
	require.Equal(t, "tollgate: not admitted: queue full: x", status.With(na, status.WithMessage("x")).Error())
}

// Bounded rebuilds an oversized status: it must keep WithoutEffect too.
func TestBoundedKeepsWithoutEffect_r18s(t *testing.T) {
	na := status.NotAdmitted(status.ReasonQueueFull)
	big := status.WithoutEffect(fmt.Errorf("%s: %w", strings.Repeat("x", 4<<10), na))
	b := status.Bounded(big)
	require.NotSame(t, big, b)
	require.Less(t, len(grpcstatus.Convert(b).Message()), 2<<10)
	require.Equal(t, status.KindNotAdmitted, status.HandlerOutcome(b, false).Kind, "Bounded dropped WithoutEffect")
	// And an error without the marker does not gain it.
	require.Equal(t, status.KindUnknown, status.HandlerOutcome(status.Bounded(fmt.Errorf("%s: %w", strings.Repeat("x", 4<<10), na)), false).Kind)
}

// NotAdmitted(ATTEMPT_REQUEST_MISMATCH) read as FAILED by OutcomeOf but
// looked like a refusal; it now builds what RequestMismatch builds for a
// tombstone, which says the same (DESIGN.md §2.2, §2.5).
func TestNotAdmittedMismatchIsRequestMismatch_r18s(t *testing.T) {
	opts := []status.Option{status.WithAttempt("a", "0", 2), status.WithRetryAfter(time.Second), status.WithMessage("m")}
	got := status.NotAdmitted(status.ReasonAttemptRequestMismatch, opts...)
	want := status.RequestMismatch(tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, opts...)
	require.Empty(t, cmpDiff(grpcstatus.Convert(want).Proto(), grpcstatus.Convert(got).Proto()))
	require.Equal(t, want.Error(), got.Error())
	o := status.OutcomeOf(got)
	require.Equal(t, status.KindFailed, o.Kind)
	require.True(t, o.Final())
	_, ok := status.Pushback(got)
	require.False(t, ok)
}

// A user found that OutcomeUnknown and Committed with WithRetryAfter sent a
// google.rpc.RetryInfo, which invites a generic client to repeat a call
// that may have (or did) take effect. The OutcomeDetail keeps the delay
// (tollgate's owner reads an ATTEMPT_UNVERIFIABLE's from it); no RetryInfo
// is sent but with a refusal.
func TestOnlyRefusalsSendRetryInfo_r18s(t *testing.T) {
	errs := map[string]error{
		"Unknown":   status.OutcomeUnknown(nil, status.WithReason(status.ReasonAttemptUnverifiable), status.WithRetryAfter(time.Second)),
		"Committed": status.Committed(status.WithRetryAfter(time.Second)),
		"Mismatch":  status.RequestMismatch(tollgatev1.Outcome_OUTCOME_COMMITTED, status.WithRetryAfter(time.Second)),
		"Refused":   status.NotAdmitted(status.ReasonShed, status.Final(), status.WithRetryAfter(time.Second)),
	}
	handlers := map[string]func(context.Context) error{}
	for name, err := range errs {
		handlers[name] = func(context.Context) error { return err }
	}
	conn := startServer(t, handlers)
	for name := range errs {
		var md metadata.MD
		err := invoke(conn, name, &md)
		w := onWireOf(t, err)
		require.Equal(t, time.Second, w.detail.GetRetryAfter().AsDuration(), name)
		ra, ok := status.RetryAfter(err)
		require.True(t, ok, name)
		require.Equal(t, time.Second, ra, name)
		if name == "Refused" {
			require.Equal(t, time.Second, w.retryInfo.GetRetryDelay().AsDuration())
			continue
		}
		require.Nil(t, w.retryInfo, "%s sent a google.rpc.RetryInfo", name)
		var n int
		for _, d := range w.st.Details() {
			if _, ok := d.(*errdetails.RetryInfo); ok {
				n++
			}
		}
		require.Zero(t, n, name)
	}
}

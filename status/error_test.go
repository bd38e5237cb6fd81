package status_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// notAdmittedCodes is the contract's code for a NOT_ADMITTED refusal of each
// reason (DESIGN.md §2.5). A reason added to the proto must be added here.
var notAdmittedCodes = map[status.Reason]codes.Code{
	status.ReasonUnspecified:            codes.ResourceExhausted,
	status.ReasonQueueFull:              codes.ResourceExhausted,
	status.ReasonConcurrencyFull:        codes.ResourceExhausted,
	status.ReasonDeadlineUnreachable:    codes.ResourceExhausted,
	status.ReasonDeadlineExpired:        codes.ResourceExhausted,
	status.ReasonShed:                   codes.ResourceExhausted,
	status.ReasonTenantLimit:            codes.ResourceExhausted,
	status.ReasonAllowanceExhausted:     codes.ResourceExhausted,
	status.ReasonRetryBudgetExhausted:   codes.ResourceExhausted,
	status.ReasonAttemptInProgress:      codes.ResourceExhausted,
	status.ReasonAttemptFenced:          codes.ResourceExhausted,
	status.ReasonDraining:               codes.Unavailable,
	status.ReasonStoreUnavailable:       codes.Unavailable,
	status.ReasonRequestTooLarge:        codes.ResourceExhausted,
	status.ReasonCallLost:               codes.ResourceExhausted,
	status.ReasonNotSent:                codes.Unavailable,
	status.ReasonAttemptRequestMismatch: codes.InvalidArgument,
	status.ReasonAttemptUnverifiable:    codes.Unavailable,
	status.ReasonResponseNotRetained:    codes.ResourceExhausted,
	status.ReasonMalformedHeader:        codes.InvalidArgument,
	status.ReasonCallKeyRequired:        codes.InvalidArgument,
}

func TestNotAdmittedEveryReason(t *testing.T) {
	require.Len(t, notAdmittedCodes, len(tollgatev1.Reason_name), "a reason without an expected code")
	for v, full := range tollgatev1.Reason_name {
		r := status.Reason(v)
		t.Run(full, func(t *testing.T) {
			want, ok := notAdmittedCodes[r]
			require.True(t, ok, "no expected code for %s", full)
			name := strings.TrimPrefix(full, "REASON_")
			final := want == codes.InvalidArgument

			err := status.NotAdmitted(r)
			wantMsg := "tollgate: not admitted: " + strings.ToLower(strings.ReplaceAll(name, "_", " "))
			if r == status.ReasonAttemptRequestMismatch { // RequestMismatch(OUTCOME_NOT_ADMITTED)
				wantMsg = "tollgate: request does not match the call key's record"
			}
			require.Equal(t, wantMsg, err.Error())
			require.Equal(t, name, status.ReasonName(r))

			w := sendOverWire(t, err)
			require.Equal(t, want, w.st.Code())
			require.Equal(t, err.Error(), w.st.Message())
			require.Empty(t, cmpProto(&errdetails.ErrorInfo{Reason: name, Domain: "tollgate.dev"}, w.errorInfo))
			require.Empty(t, cmpProto(&tollgatev1.OutcomeDetail{
				Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, Reason: r, Final: final,
			}, w.detail))
			require.Nil(t, w.retryInfo)
			require.Zero(t, w.others)

			wantKind := status.KindNotAdmitted
			if r == status.ReasonAttemptRequestMismatch {
				wantKind = status.KindFailed
			}
			for _, e := range []error{err, w.st.Err()} {
				o := status.OutcomeOf(e)
				require.Equal(t, wantKind, o.Kind)
				require.Equal(t, r, o.Reason)
				require.Equal(t, want, o.Code)
				require.Equal(t, final, o.Final())
				require.Equal(t, final, status.IsFinal(e))
			}
		})
	}
}

func cmpProto(want, got proto.Message) string {
	return cmpDiff(want, got)
}

func TestNotAdmittedOptions(t *testing.T) {
	err := status.NotAdmitted(status.ReasonAttemptFenced,
		status.WithAttempt("0190a5b2-7c3e-7def-8123-456789abcdef", "0.2.1", 3),
		status.WithRetryAfter(1500*time.Millisecond),
		status.WithClass("heavy"),
		status.WithUnitsRemaining(-2),
		status.Final(),
		status.WithFencedThroughTry(7),
		status.WithMessage("fenced by the owner"),
		nil,
	)
	require.Equal(t, "tollgate: not admitted: attempt fenced: fenced by the owner", err.Error())
	want := &tollgatev1.OutcomeDetail{
		Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, Reason: status.ReasonAttemptFenced,
		AttemptId: "0190a5b2-7c3e-7def-8123-456789abcdef", Call: "0.2.1", Try: 3,
		RetryAfter: durationpb.New(1500 * time.Millisecond), WorkloadClass: "heavy",
		UnitsRemaining: -2, Final: true, FencedThroughTry: 7,
	}
	var te *status.Error
	require.ErrorAs(t, err, &te)
	require.Empty(t, cmpProto(want, te.Detail()))
	require.Equal(t, codes.ResourceExhausted, te.Code())
	require.Equal(t, status.ReasonAttemptFenced, te.Reason())
	require.NoError(t, te.Unwrap())

	w := sendOverWire(t, err)
	require.Empty(t, cmpProto(want, w.detail))
	require.Empty(t, cmpProto(&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)}, w.retryInfo))
	require.Empty(t, cmpProto(&errdetails.ErrorInfo{Reason: "ATTEMPT_FENCED", Domain: status.Domain}, w.errorInfo))

	// Fields sets several at once and never clears what is set.
	err = status.NotAdmitted(status.ReasonShed, status.WithClass("heavy"),
		status.Fields{Try: 2, RetryAfter: -time.Second}, status.WithRetryAfter(0))
	require.ErrorAs(t, err, &te)
	require.Empty(t, cmpProto(&tollgatev1.OutcomeDetail{
		Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, Reason: status.ReasonShed, Try: 2, WorkloadClass: "heavy",
	}, te.Detail()))
	require.Nil(t, sendOverWire(t, err).retryInfo, "no RetryInfo without a positive delay")
}

// TestDetailEncoding checks the hand-written encoding of the details against
// protobuf's own, and that no field of OutcomeDetail is forgotten.
func TestDetailEncoding(t *testing.T) {
	fields := (&tollgatev1.OutcomeDetail{}).ProtoReflect().Descriptor().Fields()
	require.Equal(t, 10, fields.Len(), "OutcomeDetail changed: update status/wire.go and this test")
	for _, f := range []status.Fields{
		{},
		{AttemptID: "a", Call: "c", Try: 1, RetryAfter: time.Nanosecond, Class: "x", UnitsRemaining: 1, Final: true, FencedThroughTry: 1},
		{Try: 1<<32 - 1, FencedThroughTry: 1<<32 - 1, UnitsRemaining: -1 << 63, RetryAfter: 1<<63 - 1},
		{UnitsRemaining: 1<<63 - 1, RetryAfter: time.Second},
		{RetryAfter: 999999999},
		{AttemptID: strings.Repeat("a", 300), Class: "ü"},
	} {
		for _, r := range []status.Reason{status.ReasonQueueFull, status.Reason(-5), status.Reason(1 << 30)} {
			err := status.NotAdmitted(r, f)
			var te *status.Error
			require.ErrorAs(t, err, &te)
			w := sendOverWire(t, err)
			require.Empty(t, cmpProto(te.Detail(), w.detail), "%+v", f)
			if f.RetryAfter > 0 {
				require.Equal(t, f.RetryAfter, w.retryInfo.GetRetryDelay().AsDuration())
			}
			// Deterministic marshalling of the same detail gives the same bytes.
			want, merr := proto.MarshalOptions{Deterministic: true}.Marshal(te.Detail())
			require.NoError(t, merr)
			got, merr := proto.MarshalOptions{Deterministic: true}.Marshal(w.detail)
			require.NoError(t, merr)
			require.Equal(t, want, got)
		}
	}
}

func TestNotAdmittedFixesWhatTheContractFixes(t *testing.T) {
	t.Run("WithCode keeps the NOT_ADMITTED family", func(t *testing.T) {
		require.Equal(t, codes.Unavailable, codeOf(status.NotAdmitted(status.ReasonShed, status.WithCode(codes.Unavailable))))
		require.Equal(t, codes.ResourceExhausted, codeOf(status.NotAdmitted(status.ReasonDraining, status.WithCode(codes.ResourceExhausted))))
		for _, c := range []codes.Code{codes.OK, codes.Unknown, codes.Internal, codes.InvalidArgument, 99} {
			require.Equal(t, codes.ResourceExhausted, codeOf(status.NotAdmitted(status.ReasonShed, status.WithCode(c))), c)
		}
		require.Equal(t, codes.InvalidArgument, codeOf(status.NotAdmitted(status.ReasonMalformedHeader, status.WithCode(codes.Unavailable))))
	})
	t.Run("WithReason is ignored", func(t *testing.T) {
		err := status.NotAdmitted(status.ReasonShed, status.WithReason(status.ReasonDraining))
		o := status.OutcomeOf(err)
		require.Equal(t, status.ReasonShed, o.Reason)
		require.Equal(t, "SHED", sendOverWire(t, err).errorInfo.GetReason())
	})
	t.Run("final reasons stay final", func(t *testing.T) {
		require.True(t, status.IsFinal(status.NotAdmitted(status.ReasonCallKeyRequired, status.Fields{Final: false})))
	})
	t.Run("invalid UTF-8 is repaired, details survive", func(t *testing.T) {
		err := status.NotAdmitted(status.ReasonShed, status.WithAttempt("a\xff", "c\xfe", 1),
			status.WithClass("h\xc3"), status.WithMessage("m\xff"))
		require.Equal(t, "tollgate: not admitted: shed: m\uFFFD", err.Error())
		w := sendOverWire(t, err)
		require.Equal(t, "a\uFFFD", w.detail.GetAttemptId())
		require.Equal(t, "c\uFFFD", w.detail.GetCall())
		require.Equal(t, "h\uFFFD", w.detail.GetWorkloadClass())
	})
}

func codeOf(err error) codes.Code { return grpcstatus.Code(err) }

func TestOutcomeUnknownEveryCode(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		t.Run(c.String(), func(t *testing.T) {
			cause := grpcstatus.Error(c, "below")
			want := c
			switch c {
			case codes.OK, codes.Unavailable, codes.ResourceExhausted:
				want = codes.Unknown // never a code generic policies retry; OK is no error
			}
			err := status.OutcomeUnknown(cause, status.WithAttempt("a1", "0", 2))
			require.Equal(t, want, codeOf(err))
			if cause != nil {
				require.ErrorIs(t, err, cause)
				require.Equal(t, "tollgate: outcome unknown: "+cause.Error(), err.Error())
			} else {
				require.Equal(t, "tollgate: outcome unknown", err.Error())
			}
			w := sendOverWire(t, err)
			require.Equal(t, want, w.st.Code())
			require.Empty(t, cmpProto(&tollgatev1.OutcomeDetail{
				Outcome: tollgatev1.Outcome_OUTCOME_UNKNOWN, AttemptId: "a1", Call: "0", Try: 2,
			}, w.detail))
			require.Empty(t, cmpProto(&errdetails.ErrorInfo{Reason: "UNSPECIFIED", Domain: status.Domain}, w.errorInfo))
			for _, e := range []error{err, w.st.Err()} {
				o := status.OutcomeOf(e)
				require.Equal(t, status.KindUnknown, o.Kind)
				require.Equal(t, want, o.Code)
				require.False(t, o.Final())
			}
		})
	}
	t.Run("WithCode cannot make it retryable", func(t *testing.T) {
		for _, c := range []codes.Code{codes.OK, codes.Unavailable, codes.ResourceExhausted, 17, 1000} {
			require.Equal(t, codes.Unknown, codeOf(status.OutcomeUnknown(nil, status.WithCode(c))), c)
		}
		require.Equal(t, codes.DeadlineExceeded, codeOf(status.OutcomeUnknown(nil, status.WithCode(codes.DeadlineExceeded))))
	})
	t.Run("context causes", func(t *testing.T) {
		require.Equal(t, codes.DeadlineExceeded, codeOf(status.OutcomeUnknown(context.DeadlineExceeded)))
		require.Equal(t, codes.Canceled, codeOf(status.OutcomeUnknown(fmt.Errorf("wait: %w", context.Canceled))))
		require.Equal(t, codes.Unknown, codeOf(status.OutcomeUnknown(errors.New("plain"))))
	})
	t.Run("reason and invalid UTF-8 in the cause", func(t *testing.T) {
		err := status.OutcomeUnknown(errors.New("store said \xff\xfe"), status.WithReason(status.ReasonCallLost))
		w := sendOverWire(t, err)
		require.Equal(t, status.ReasonCallLost, w.detail.GetReason())
		require.Equal(t, "CALL_LOST", w.errorInfo.GetReason())
		require.Equal(t, status.ReasonCallLost, status.OutcomeOf(w.st.Err()).Reason)
	})
}

func TestCommitted(t *testing.T) {
	err := status.Committed(status.WithAttempt("a1", "0", 1), status.WithCode(codes.Internal))
	require.Equal(t, "tollgate: committed: response not retained", err.Error())
	w := sendOverWire(t, err)
	require.Equal(t, codes.FailedPrecondition, w.st.Code())
	require.Empty(t, cmpProto(&tollgatev1.OutcomeDetail{
		Outcome: tollgatev1.Outcome_OUTCOME_COMMITTED, Reason: status.ReasonResponseNotRetained,
		AttemptId: "a1", Call: "0", Try: 1, Final: true,
	}, w.detail))
	require.Empty(t, cmpProto(&errdetails.ErrorInfo{Reason: "RESPONSE_NOT_RETAINED", Domain: status.Domain}, w.errorInfo))
	for _, e := range []error{err, w.st.Err()} {
		o := status.OutcomeOf(e)
		require.Equal(t, status.KindCommitted, o.Kind)
		require.Equal(t, status.ReasonResponseNotRetained, o.Reason)
		require.Equal(t, codes.FailedPrecondition, o.Code)
		require.True(t, o.Final())
	}
}

func TestRequestMismatch(t *testing.T) {
	for v, name := range tollgatev1.Outcome_name {
		existing := tollgatev1.Outcome(v)
		t.Run(name, func(t *testing.T) {
			err := status.RequestMismatch(existing, status.WithReason(status.ReasonShed), status.WithCode(codes.NotFound))
			require.Equal(t, "tollgate: request does not match the call key's record", err.Error())
			w := sendOverWire(t, err)
			require.Equal(t, codes.InvalidArgument, w.st.Code())
			require.Empty(t, cmpProto(&tollgatev1.OutcomeDetail{
				Outcome: existing, Reason: status.ReasonAttemptRequestMismatch, Final: true,
			}, w.detail))
			require.Empty(t, cmpProto(&errdetails.ErrorInfo{Reason: "ATTEMPT_REQUEST_MISMATCH", Domain: status.Domain}, w.errorInfo))
			for _, e := range []error{err, w.st.Err()} {
				o := status.OutcomeOf(e)
				require.Equal(t, status.KindFailed, o.Kind)
				require.Equal(t, status.ReasonAttemptRequestMismatch, o.Reason)
				require.Equal(t, existing, o.Detail.GetOutcome())
				require.True(t, o.Final())
			}
		})
	}
}

func TestGRPCStatusIsStable(t *testing.T) {
	err := status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second))
	var te *status.Error
	require.ErrorAs(t, err, &te)
	a, b := te.GRPCStatus(), te.GRPCStatus()
	require.Same(t, a, b)
	d := te.Detail()
	d.Reason = status.ReasonShed // the caller's copy
	require.Equal(t, status.ReasonQueueFull, te.Detail().GetReason())
}

func TestReasonName(t *testing.T) {
	require.Equal(t, "QUEUE_FULL", status.ReasonName(status.ReasonQueueFull))
	require.Equal(t, "UNSPECIFIED", status.ReasonName(status.Reason(999)))
	require.Equal(t, "UNSPECIFIED", status.ReasonName(status.Reason(-1)))
}

// An unknown outcome wrapped again, here or after crossing the wire, says
// "outcome unknown" once, not once per layer.
func TestOutcomeUnknownOfAnUnknownOutcomeSaysItOnce(t *testing.T) {
	inner := status.OutcomeUnknown(errors.New("interceptor: handler panic: boom"))
	again := status.OutcomeUnknown(inner)
	require.Equal(t, "tollgate: outcome unknown: interceptor: handler panic: boom", grpcstatus.Convert(again).Message())
	wire := grpcstatus.Convert(again).Err() // as the client receives it
	third := status.OutcomeUnknown(wire)
	require.Equal(t, "tollgate: outcome unknown: interceptor: handler panic: boom", grpcstatus.Convert(third).Message())
	require.Equal(t, 1, strings.Count(third.Error(), "outcome unknown"), third.Error())
}

// grpcMessageSize is the size of msg as grpc-message carries it: every byte
// outside printable ASCII, and '%', percent-encoded.
func grpcMessageSize(msg string) int {
	n := 0
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < ' ' || c > '~' || c == '%' {
			n += 3
		} else {
			n++
		}
	}
	return n
}

// A review found that the message of an outcome grew without bound: every
// constructor put another error's message (a cause, a re-addressed refusal's
// text, a spent budget's last try) into its own, and the message goes on the
// wire twice (grpc-message and grpc-status-details-bin), so that a long one
// cost a caller with an 8 KiB header list limit the whole answer (see
// TestMessageChainKeepsAnswerOfLargeMessage in interceptor). The message
// is now at most 1 KiB as grpc-message sends it, cut in the middle, on rune
// boundaries, with a "…"; a short one is unchanged.
func TestMessageIsBounded(t *testing.T) {
	short := status.NotAdmitted(status.ReasonShed, status.WithMessage("backend: 50% busy, é"))
	require.Equal(t, "tollgate: not admitted: shed: backend: 50% busy, é", short.Error())

	for _, filler := range []string{"x", "%", "é", "€", "😀", "\n"} {
		long := strings.Repeat(filler, 5<<10)
		for name, err := range map[string]error{
			"cause":   status.OutcomeUnknown(errors.New(long), status.WithMessage("interceptor: the end")),
			"message": status.NotAdmitted(status.ReasonQueueFull, status.WithMessage(long+" the end")),
			"with":    status.With(status.Committed(), status.WithMessage(long+" the end")),
		} {
			msg := grpcstatus.Convert(err).Message()
			require.Equal(t, err.Error(), msg)
			require.LessOrEqual(t, grpcMessageSize(msg), 1<<10, "%s of %q", name, filler)
			require.Greater(t, grpcMessageSize(msg), 1<<10-12, "%s of %q: no more is cut than needed", name, filler)
			require.True(t, utf8.ValidString(msg), "%s of %q: cut on rune boundaries", name, filler)
			require.True(t, strings.HasPrefix(msg, "tollgate: "), "%s of %q: %q", name, filler, msg)
			require.True(t, strings.HasSuffix(msg, " the end"), "%s of %q: the end survives", name, filler)
			require.Equal(t, 1, strings.Count(msg, "…"), "%s of %q", name, filler)
		}
	}

	// Rebuilt hop after hop, each time embedding the last message (as a spent
	// retry budget names its last try), it stays bounded.
	err := status.OutcomeUnknown(errors.New(strings.Repeat("x", 900)))
	for range 10 {
		err = status.NotAdmitted(status.ReasonRetryBudgetExhausted, status.WithMessage("retry budget exhausted; last try: "+err.Error()))
		err = grpcstatus.Convert(err).Err() // across the wire
		require.LessOrEqual(t, grpcMessageSize(grpcstatus.Convert(err).Message()), 1<<10)
	}
	// An unknown outcome of an unknown outcome still says it once.
	again := status.OutcomeUnknown(grpcstatus.Convert(status.OutcomeUnknown(errors.New(strings.Repeat("y", 4<<10)))).Err())
	require.Equal(t, 1, strings.Count(again.Error(), "outcome unknown"), again.Error())
	require.LessOrEqual(t, grpcMessageSize(again.Error()), 1<<10)
}

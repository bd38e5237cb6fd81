package status_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

var definiteCodes = map[codes.Code]bool{
	codes.InvalidArgument: true, codes.NotFound: true, codes.AlreadyExists: true,
	codes.PermissionDenied: true, codes.FailedPrecondition: true, codes.OutOfRange: true,
	codes.Unimplemented: true, codes.Unauthenticated: true,
}

// received is err as a client receives it: a plain grpc-go status error.
func received(t testing.TB, err error) error {
	t.Helper()
	return sendOverWire(t, err).st.Err()
}

// statusWith builds a received status error with the given details.
func statusWith(t testing.TB, code codes.Code, details ...proto.Message) error {
	t.Helper()
	p := &spb.Status{Code: int32(code), Message: "from afar"}
	for _, d := range details {
		if a, ok := d.(*anypb.Any); ok {
			p.Details = append(p.Details, a)
			continue
		}
		a, err := anypb.New(d)
		require.NoError(t, err)
		p.Details = append(p.Details, a)
	}
	return grpcstatus.FromProto(p).Err()
}

func TestOutcomeOf(t *testing.T) {
	refusal := status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second))
	wantRefusal := status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonQueueFull, Code: codes.ResourceExhausted}
	unknown := status.OutcomeUnknown(grpcstatus.Error(codes.DeadlineExceeded, "slow"), status.WithReason(status.ReasonCallLost))
	wantUnknown := status.Outcome{Kind: status.KindUnknown, Reason: status.ReasonCallLost, Code: codes.DeadlineExceeded}

	for _, c := range []struct {
		name       string
		err        error
		want       status.Outcome
		wantDetail bool
	}{
		{"nil", nil, status.Outcome{Kind: status.KindOK, Code: codes.OK}, false},
		{"Error", refusal, wantRefusal, true},
		{"wrapped", fmt.Errorf("reserve stock: %w", refusal), wantRefusal, true},
		{"wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", refusal)), wantRefusal, true},
		{"max retries exhausted", fmt.Errorf("max retries exhausted: failed after %d attempts: %w", 3, received(t, refusal)), wantRefusal, true},
		{"max retries exhausted, Error", fmt.Errorf("max retries exhausted: failed after %d attempts: %w", 3, refusal), wantRefusal, true},
		{"received", received(t, refusal), wantRefusal, true},
		{"status.Err round trip", grpcstatus.Convert(refusal).Err(), wantRefusal, true},
		{"joined", errors.Join(errors.New("first"), refusal), wantRefusal, true},
		{"WithoutEffect", status.WithoutEffect(refusal), wantRefusal, true},
		{"unknown", unknown, wantUnknown, true},
		{"unknown received", received(t, unknown), wantUnknown, true},
		{"context.Canceled", context.Canceled, status.Outcome{Kind: status.KindUnknown, Code: codes.Canceled}, false},
		{"context.DeadlineExceeded", context.DeadlineExceeded, status.Outcome{Kind: status.KindUnknown, Code: codes.DeadlineExceeded}, false},
		{"wrapped context error", fmt.Errorf("wait: %w", context.DeadlineExceeded), status.Outcome{Kind: status.KindUnknown, Code: codes.DeadlineExceeded}, false},
		{"grpc context error", grpcstatus.FromContextError(context.Canceled).Err(), status.Outcome{Kind: status.KindUnknown, Code: codes.Canceled}, false},
		{"plain", errors.New("boom"), status.Outcome{Kind: status.KindUnknown, Code: codes.Unknown}, false},
		{"status and context error", errors.Join(grpcstatus.Error(codes.NotFound, "x"), context.Canceled), status.Outcome{Kind: status.KindUnknown, Code: codes.NotFound}, false},
		{"nil GRPCStatus", nilStatusErr{}, status.Outcome{Kind: status.KindUnknown, Code: codes.Unknown}, false},
		{"status claims OK", okStatusErr{}, status.Outcome{Kind: status.KindUnknown, Code: codes.Unknown}, false},
		{"typed nil Error", (*status.Error)(nil), status.Outcome{Kind: status.KindUnknown, Code: codes.Unknown}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := status.OutcomeOf(c.err)
			detail := o.Detail
			o.Detail = nil
			require.Equal(t, c.want, o)
			require.Equal(t, c.wantDetail, detail != nil)
		})
	}

	t.Run("every code without a detail", func(t *testing.T) {
		for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
			want := status.KindUnknown
			if definiteCodes[code] {
				want = status.KindFailed
			}
			o := status.OutcomeOf(grpcstatus.Error(code, "x"))
			require.Equal(t, status.Outcome{Kind: want, Code: code}, o, code)
			require.Equal(t, definiteCodes[code], status.IsDefinite(code), code)
		}
		require.Equal(t, status.KindUnknown, status.OutcomeOf(grpcstatus.Error(99, "x")).Kind)
	})

	t.Run("the outer status decides", func(t *testing.T) {
		// grpc-go sends the first status in the chain; so does OutcomeOf.
		err := outerStatusErr{code: codes.Internal, inner: refusal}
		require.Equal(t, codes.Internal, grpcstatus.Code(err))
		require.Equal(t, status.Outcome{Kind: status.KindUnknown, Code: codes.Internal}, status.OutcomeOf(err))
	})

	t.Run("detail is the caller's", func(t *testing.T) {
		o := status.OutcomeOf(refusal)
		o.Detail.Reason = status.ReasonShed
		require.Equal(t, status.ReasonQueueFull, status.OutcomeOf(refusal).Detail.GetReason())
	})
}

type nilStatusErr struct{}

func (nilStatusErr) Error() string                  { return "nil status" }
func (nilStatusErr) GRPCStatus() *grpcstatus.Status { return nil }

type okStatusErr struct{}

func (okStatusErr) Error() string                  { return "ok status" }
func (okStatusErr) GRPCStatus() *grpcstatus.Status { return grpcstatus.New(codes.OK, "") }

type outerStatusErr struct {
	code  codes.Code
	inner error
}

func (e outerStatusErr) Error() string                  { return "outer: " + e.inner.Error() }
func (e outerStatusErr) Unwrap() error                  { return e.inner }
func (e outerStatusErr) GRPCStatus() *grpcstatus.Status { return grpcstatus.New(e.code, e.Error()) }

func TestOutcomeOfCall(t *testing.T) {
	deliveries := []status.Delivery{status.MaybeSent, status.NotSent, status.PeerStatus, status.Delivery(42)}
	for _, d := range deliveries {
		for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
			var want status.Outcome
			switch {
			case d == status.NotSent && definiteCodes[code]:
				// A client-side failure no repeat can mend.
				want = status.Outcome{Kind: status.KindFailed, Code: code}
			case d == status.NotSent:
				want = status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonNotSent, Code: code}
			case d == status.PeerStatus && definiteCodes[code]:
				want = status.Outcome{Kind: status.KindFailed, Code: code}
			case d == status.PeerStatus:
				want = status.Outcome{Kind: status.KindUnknown, Code: code}
			default: // MaybeSent, and values not declared
				want = status.Outcome{Kind: status.KindUnknown, Reason: status.ReasonCallLost, Code: code}
			}
			require.Equal(t, want, status.OutcomeOfCall(grpcstatus.Error(code, "x"), d), "%v %v", d, code)
		}
		require.Equal(t, status.Outcome{Kind: status.KindOK, Code: codes.OK}, status.OutcomeOfCall(nil, d))

		// A tollgate detail decides whatever the delivery.
		for _, err := range []error{
			status.NotAdmitted(status.ReasonAllowanceExhausted),
			received(t, status.NotAdmitted(status.ReasonDraining)),
			status.OutcomeUnknown(nil),
			status.Committed(),
			status.RequestMismatch(tollgatev1.Outcome_OUTCOME_COMMITTED),
		} {
			want := status.OutcomeOf(err)
			got := status.OutcomeOfCall(err, d)
			require.Equal(t, want.Kind, got.Kind)
			require.Equal(t, want.Reason, got.Reason)
			require.Equal(t, want.Code, got.Code)
			require.Empty(t, cmpDiff(want.Detail, got.Detail))
		}
	}
	t.Run("context errors after the peer's status are not definite", func(t *testing.T) {
		err := errors.Join(grpcstatus.Error(codes.NotFound, "x"), context.DeadlineExceeded)
		require.Equal(t, status.KindUnknown, status.OutcomeOfCall(err, status.PeerStatus).Kind)
		require.Equal(t, status.KindUnknown, status.OutcomeOfCall(context.Canceled, status.PeerStatus).Kind)
		require.Equal(t, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonNotSent, Code: codes.Canceled},
			status.OutcomeOfCall(context.Canceled, status.NotSent))
	})
	require.Equal(t, "MAYBE_SENT", status.MaybeSent.String())
	require.Equal(t, "NOT_SENT", status.NotSent.String())
	require.Equal(t, "PEER_STATUS", status.PeerStatus.String())
	require.Equal(t, "INVALID", status.Delivery(42).String())
}

func TestHandlerOutcome(t *testing.T) {
	refusal := status.NotAdmitted(status.ReasonQueueFull, status.WithClass("heavy"))
	finalBelow := status.NotAdmitted(status.ReasonCallKeyRequired)
	unknownOf := func(code codes.Code) status.Outcome { return status.Outcome{Kind: status.KindUnknown, Code: code} }
	for _, c := range []struct {
		name          string
		err           error
		noSideEffects bool
		want          status.Outcome
	}{
		{"nil", nil, false, status.Outcome{Kind: status.KindOK, Code: codes.OK}},
		{"NOT_ADMITTED", refusal, false, unknownOf(codes.Unknown)},
		{"NOT_ADMITTED received", received(t, refusal), false, unknownOf(codes.Unknown)},
		{"NOT_ADMITTED wrapped", fmt.Errorf("reserve: %w", refusal), false, unknownOf(codes.Unknown)},
		{"NOT_ADMITTED final below", finalBelow, false, unknownOf(codes.InvalidArgument)},
		{"NOT_ADMITTED, NO_SIDE_EFFECTS", refusal, true, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonQueueFull, Code: codes.ResourceExhausted}},
		{"NOT_ADMITTED WithoutEffect", status.WithoutEffect(refusal), false, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonQueueFull, Code: codes.ResourceExhausted}},
		{"NOT_ADMITTED WithoutEffect received", status.WithoutEffect(received(t, refusal)), false, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonQueueFull, Code: codes.ResourceExhausted}},
		{"NOT_ADMITTED WithoutEffect wrapped", fmt.Errorf("reserve: %w", status.WithoutEffect(fmt.Errorf("stock: %w", refusal))), false, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonQueueFull, Code: codes.ResourceExhausted}},
		{"NOT_ADMITTED WithoutEffect, NO_SIDE_EFFECTS", status.WithoutEffect(refusal), true, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonQueueFull, Code: codes.ResourceExhausted}},
		{"UNKNOWN", status.OutcomeUnknown(grpcstatus.Error(codes.Internal, "x")), false, unknownOf(codes.Internal)},
		{"UNKNOWN, NO_SIDE_EFFECTS", received(t, status.OutcomeUnknown(context.DeadlineExceeded)), true, unknownOf(codes.DeadlineExceeded)},
		{"UNKNOWN WithoutEffect", status.WithoutEffect(status.OutcomeUnknown(nil)), false, unknownOf(codes.Unknown)},
		{"COMMITTED", status.Committed(), false, unknownOf(codes.FailedPrecondition)},
		{"COMMITTED WithoutEffect, NO_SIDE_EFFECTS", status.WithoutEffect(status.Committed()), true, unknownOf(codes.FailedPrecondition)},
		{"mismatch", received(t, status.RequestMismatch(tollgatev1.Outcome_OUTCOME_NOT_ADMITTED)), false, unknownOf(codes.InvalidArgument)},
		{"mismatch WithoutEffect, NO_SIDE_EFFECTS", status.WithoutEffect(status.RequestMismatch(tollgatev1.Outcome_OUTCOME_NOT_ADMITTED)), true, unknownOf(codes.InvalidArgument)},
		{"context error", context.DeadlineExceeded, false, unknownOf(codes.DeadlineExceeded)},
		{"plain", errors.New("boom"), true, unknownOf(codes.Unknown)},
		{"WithoutEffect plain", status.WithoutEffect(errors.New("boom")), false, unknownOf(codes.Unknown)},
		{"WithoutEffect on another branch of a join", errors.Join(status.WithoutEffect(errors.New("boom")), refusal), false, unknownOf(codes.Unknown)},
		{"WithoutEffect on the found branch of a join", errors.Join(errors.New("boom"), status.WithoutEffect(refusal)), false, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonQueueFull, Code: codes.ResourceExhausted}},
		{"WithoutEffect around a join", status.WithoutEffect(errors.Join(errors.New("boom"), refusal)), false, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonQueueFull, Code: codes.ResourceExhausted}},
		{"WithoutEffect through As", asErr{target: status.WithoutEffect(refusal)}, false, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonQueueFull, Code: codes.ResourceExhausted}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := status.HandlerOutcome(c.err, c.noSideEffects)
			hasDetail := o.Detail != nil
			o.Detail = nil
			require.Equal(t, c.want, o)
			require.Equal(t, c.want.Kind == status.KindNotAdmitted, hasDetail)
			if c.want.Kind == status.KindUnknown {
				require.False(t, o.Final(), "a detail from below does not make this call final")
			}
			if c.err != nil && c.want.Kind == status.KindUnknown {
				require.Equal(t, c.want.Code, codeOf(status.OutcomeUnknown(c.err)), "the code OutcomeUnknown would send")
			}
		})
	}
	t.Run("no detail, every code", func(t *testing.T) {
		for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
			want := status.KindUnknown
			if definiteCodes[code] {
				want = status.KindFailed
			}
			for _, nse := range []bool{false, true} {
				require.Equal(t, status.Outcome{Kind: want, Code: code}, status.HandlerOutcome(grpcstatus.Error(code, "x"), nse), code)
			}
		}
	})
}

func TestWithoutEffect(t *testing.T) {
	require.NoError(t, status.WithoutEffect(nil))
	refusal := status.NotAdmitted(status.ReasonShed)
	w := status.WithoutEffect(refusal)
	require.Equal(t, refusal.Error(), w.Error())
	require.ErrorIs(t, w, refusal)
	require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(w))
	st, ok := grpcstatus.FromError(w)
	require.True(t, ok)
	require.Len(t, st.Details(), 2)

	// Wrapping a context error keeps grpc-go's mapping of it.
	w = status.WithoutEffect(context.DeadlineExceeded)
	_, ok = grpcstatus.FromError(w)
	require.False(t, ok, "no status of its own, so grpc-go maps the context error")
	require.Equal(t, codes.DeadlineExceeded, grpcstatus.FromContextError(w).Code())
	require.ErrorIs(t, w, context.DeadlineExceeded)
}

func TestRetryAfter(t *testing.T) {
	dur := func(d time.Duration) *durationpb.Duration { return durationpb.New(d) }
	detail := func(ra *durationpb.Duration) *tollgatev1.OutcomeDetail {
		return &tollgatev1.OutcomeDetail{Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, Reason: status.ReasonShed, RetryAfter: ra}
	}
	retryInfo := func(d *durationpb.Duration) *errdetails.RetryInfo { return &errdetails.RetryInfo{RetryDelay: d} }
	invalid := &durationpb.Duration{Seconds: 1, Nanos: -5}
	for _, c := range []struct {
		name string
		err  error
		want time.Duration
	}{
		{"nil", nil, 0},
		{"plain", errors.New("x"), 0},
		{"no detail", grpcstatus.Error(codes.Unavailable, "x"), 0},
		{"Error", status.NotAdmitted(status.ReasonShed, status.WithRetryAfter(1500*time.Millisecond)), 1500 * time.Millisecond},
		{"Error without delay", status.NotAdmitted(status.ReasonShed), 0},
		{"Error wrapped", fmt.Errorf("x: %w", status.NotAdmitted(status.ReasonShed, status.WithRetryAfter(time.Second))), time.Second},
		{"received", received(t, status.NotAdmitted(status.ReasonShed, status.WithRetryAfter(time.Second))), time.Second},
		{"RetryInfo preferred", statusWith(t, codes.ResourceExhausted, detail(dur(2*time.Second)), retryInfo(dur(3*time.Second))), 3 * time.Second},
		{"RetryInfo first, then detail", statusWith(t, codes.ResourceExhausted, retryInfo(dur(3*time.Second)), detail(dur(2*time.Second))), 3 * time.Second},
		{"RetryInfo alone", statusWith(t, codes.Unavailable, retryInfo(dur(time.Second))), time.Second},
		{"detail alone", statusWith(t, codes.ResourceExhausted, detail(dur(2*time.Second))), 2 * time.Second},
		{"RetryInfo invalid", statusWith(t, codes.ResourceExhausted, retryInfo(invalid), detail(dur(2*time.Second))), 2 * time.Second},
		{"RetryInfo negative", statusWith(t, codes.ResourceExhausted, retryInfo(dur(-time.Second)), detail(dur(2*time.Second))), 2 * time.Second},
		{"RetryInfo zero", statusWith(t, codes.ResourceExhausted, retryInfo(dur(0)), detail(dur(2*time.Second))), 2 * time.Second},
		{"RetryInfo empty", statusWith(t, codes.ResourceExhausted, retryInfo(nil), detail(dur(2*time.Second))), 2 * time.Second},
		{"both invalid", statusWith(t, codes.ResourceExhausted, retryInfo(invalid), detail(&durationpb.Duration{Seconds: 315576000001})), 0},
		{"detail negative", statusWith(t, codes.ResourceExhausted, detail(dur(-time.Second))), 0},
		{"second RetryInfo ignored", statusWith(t, codes.ResourceExhausted, retryInfo(dur(time.Second)), retryInfo(dur(time.Hour))), time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, ok := status.RetryAfter(c.err)
			require.Equal(t, c.want, d)
			require.Equal(t, c.want > 0, ok)
		})
	}
}

func TestIsFinal(t *testing.T) {
	require.False(t, status.IsFinal(nil))
	require.False(t, status.IsFinal(errors.New("x")))
	require.False(t, status.IsFinal(grpcstatus.Error(codes.InvalidArgument, "x")))
	require.False(t, status.IsFinal(status.NotAdmitted(status.ReasonShed)))
	require.False(t, status.IsFinal(status.OutcomeUnknown(nil)))
	require.True(t, status.IsFinal(status.NotAdmitted(status.ReasonAllowanceExhausted, status.Final())))
	require.True(t, status.IsFinal(received(t, status.NotAdmitted(status.ReasonAllowanceExhausted, status.Final()))))
	require.True(t, status.IsFinal(fmt.Errorf("x: %w", status.NotAdmitted(status.ReasonMalformedHeader))))
	require.True(t, status.IsFinal(status.Committed()))
	require.True(t, status.IsFinal(received(t, status.RequestMismatch(tollgatev1.Outcome_OUTCOME_UNKNOWN))))
}

func TestPushback(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		want   string
		wantOK bool
	}{
		{"whole ms", status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(1500*time.Millisecond)), "1500", true},
		{"rounds up", status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(1500*time.Millisecond+time.Nanosecond)), "1501", true},
		{"1ns", status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Nanosecond)), "1", true},
		{"999µs", status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(999*time.Microsecond)), "1", true},
		{"2s", status.NotAdmitted(status.ReasonDraining, status.WithRetryAfter(2*time.Second)), "2000", true},
		{"received", received(t, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(1200*time.Microsecond))), "2", true},
		{"wrapped", fmt.Errorf("x: %w", status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second))), "1000", true},
		{"no delay", status.NotAdmitted(status.ReasonQueueFull), "", false},
		// A final refusal without a delay tells grpc-go's retry not to
		// repeat: no repeat of the attempt can help. One with a delay keeps
		// it, for a new attempt.
		{"final", status.NotAdmitted(status.ReasonDeadlineExpired, status.Final()), "-1", true},
		{"final received", received(t, status.NotAdmitted(status.ReasonRequestTooLarge, status.Final())), "-1", true},
		{"final with a delay", status.NotAdmitted(status.ReasonAttemptUnverifiable, status.WithRetryAfter(time.Second), status.Final()), "1000", true},
		{"UNKNOWN", status.OutcomeUnknown(nil, status.WithRetryAfter(time.Second)), "", false},
		{"COMMITTED", status.Committed(status.WithRetryAfter(time.Second)), "", false},
		{"mismatch", status.RequestMismatch(tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, status.WithRetryAfter(time.Second)), "", false},
		{"RetryInfo without detail", statusWith(t, codes.Unavailable, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)}), "", false},
		{"plain", errors.New("x"), "", false},
		{"nil", nil, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, ok := status.Pushback(c.err)
			require.Equal(t, c.want, v)
			require.Equal(t, c.wantOK, ok)
		})
	}
}

func TestSetPushbackTrailerOutsideAServer(t *testing.T) {
	ctx := context.Background()
	require.NoError(t, status.SetPushbackTrailer(ctx, nil))
	require.NoError(t, status.SetPushbackTrailer(ctx, status.NotAdmitted(status.ReasonShed)), "no delay, nothing to set")
	require.Error(t, status.SetPushbackTrailer(ctx, status.NotAdmitted(status.ReasonShed, status.WithRetryAfter(time.Second))),
		"grpc.SetTrailer's error: no server stream in the context")
}

// TestCorruptDetails feeds details that do not decode, or decode to values
// this build does not know: they are classified by code and never panic.
func TestCorruptDetails(t *testing.T) {
	garbage := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}
	detailURL := "type.googleapis.com/tollgate.v1.OutcomeDetail"
	enc := func(fields ...uint64) []byte { // pairs of (field number, varint value)
		var b []byte
		for i := 0; i < len(fields); i += 2 {
			b = protowire.AppendTag(b, protowire.Number(fields[i]), protowire.VarintType)
			b = protowire.AppendVarint(b, fields[i+1])
		}
		return b
	}
	badUTF8 := protowire.AppendString(protowire.AppendTag(enc(1, 1), 3, protowire.BytesType), "a\xff")
	for _, c := range []struct {
		name       string
		code       codes.Code
		detail     *anypb.Any
		wantKind   status.Kind
		wantReason status.Reason
	}{
		{"garbage bytes, overload code", codes.ResourceExhausted, &anypb.Any{TypeUrl: detailURL, Value: garbage}, status.KindUnknown, 0},
		{"garbage bytes, definite code", codes.InvalidArgument, &anypb.Any{TypeUrl: detailURL, Value: garbage}, status.KindFailed, 0},
		{"truncated", codes.NotFound, &anypb.Any{TypeUrl: detailURL, Value: []byte{0x0a}}, status.KindFailed, 0},
		{"invalid UTF-8 string", codes.Unavailable, &anypb.Any{TypeUrl: detailURL, Value: badUTF8}, status.KindUnknown, 0},
		{"unknown type URL", codes.PermissionDenied, &anypb.Any{TypeUrl: "type.googleapis.com/nobody.Knows", Value: garbage}, status.KindFailed, 0},
		{"empty type URL", codes.Unavailable, &anypb.Any{}, status.KindUnknown, 0},
		{"unknown outcome", codes.ResourceExhausted, &anypb.Any{TypeUrl: detailURL, Value: enc(1, 99, 2, 1)}, status.KindUnknown, status.ReasonQueueFull},
		{"negative outcome", codes.ResourceExhausted, &anypb.Any{TypeUrl: detailURL, Value: enc(1, 1<<64-1)}, status.KindUnknown, 0},
		{"unknown reason", codes.ResourceExhausted, &anypb.Any{TypeUrl: detailURL, Value: enc(1, 1, 2, 999)}, status.KindNotAdmitted, 999},
		{"unknown field", codes.ResourceExhausted, &anypb.Any{TypeUrl: detailURL, Value: enc(1, 1, 2, 5, 77, 1)}, status.KindNotAdmitted, status.ReasonShed},
		{"unspecified outcome", codes.InvalidArgument, &anypb.Any{TypeUrl: detailURL, Value: enc(2, 1)}, status.KindUnknown, status.ReasonQueueFull},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := statusWith(t, c.code, c.detail)
			o := status.OutcomeOf(err)
			require.Equal(t, c.wantKind, o.Kind)
			require.Equal(t, c.wantReason, o.Reason)
			require.Equal(t, c.code, o.Code)
			if c.wantReason == 999 {
				require.Equal(t, "UNSPECIFIED", status.ReasonName(o.Reason))
			}
			_, _ = status.RetryAfter(err)
			_ = status.IsFinal(err)
			_, _ = status.Pushback(err)
			_ = status.HandlerOutcome(err, true)
			_ = status.OutcomeOfCall(err, status.PeerStatus)
		})
	}
}

func TestKindString(t *testing.T) {
	require.Equal(t, "OK", status.KindOK.String())
	require.Equal(t, "FAILED", status.KindFailed.String())
	require.Equal(t, "NOT_ADMITTED", status.KindNotAdmitted.String())
	require.Equal(t, "UNKNOWN", status.KindUnknown.String())
	require.Equal(t, "COMMITTED", status.KindCommitted.String())
	require.Equal(t, "INVALID", status.Kind(200).String())
}

// asErr finds target through an As method, as some error libraries do.
type asErr struct{ target error }

func (e asErr) Error() string { return "as: " + e.target.Error() }
func (e asErr) As(target any) bool {
	v := reflect.ValueOf(target).Elem()
	if reflect.TypeOf(e.target).AssignableTo(v.Type()) {
		v.Set(reflect.ValueOf(e.target))
		return true
	}
	return false
}

func TestOutcomeOfUnusualChains(t *testing.T) {
	refusal := status.NotAdmitted(status.ReasonShed)
	t.Run("As method", func(t *testing.T) {
		err := asErr{target: refusal}
		require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(err), "grpc-go finds it too")
		require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind)
		err = asErr{target: received(t, refusal)}
		require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind)
		require.Equal(t, status.KindUnknown, status.OutcomeOf(asErr{target: errors.New("x")}).Kind)
	})
	t.Run("joined without a status", func(t *testing.T) {
		o := status.OutcomeOf(errors.Join(errors.New("a"), fmt.Errorf("b: %w", context.Canceled)))
		require.Equal(t, status.Outcome{Kind: status.KindUnknown, Code: codes.Canceled}, o)
	})
	t.Run("deep chains are cut off, not followed forever", func(t *testing.T) {
		err := refusal
		for range 50 {
			err = fmt.Errorf("layer: %w", err)
		}
		require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind)
		for range 200 {
			err = fmt.Errorf("layer: %w", err)
		}
		require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind)
	})
}

func TestGRPCStatusConcurrently(t *testing.T) {
	err := status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second))
	var te *status.Error
	require.ErrorAs(t, err, &te)
	sts := make(chan *grpcstatus.Status, 8)
	var wg sync.WaitGroup
	for range cap(sts) {
		wg.Go(func() { sts <- te.GRPCStatus() })
	}
	wg.Wait()
	close(sts)
	first := te.GRPCStatus()
	for st := range sts {
		require.Same(t, first, st)
	}
}

func TestNilError(t *testing.T) {
	var te *status.Error
	require.Equal(t, "tollgate: <nil>", te.Error())
	require.NoError(t, te.Unwrap())
	require.Nil(t, te.GRPCStatus())
}

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
func TestStatusUnknownTwoErrorInfo(t *testing.T) {
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
func TestStatusTypeURL(t *testing.T) {
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

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// OutcomeOf promises to read "the error that decides the gRPC status (the
// first one in the chain that has a GRPCStatus method, as
// grpc/status.FromError does)". In a join (errors.Join, fmt.Errorf with
// several %w), find() goes on to the next branch when a branch's
// GRPCStatus is nil; grpc-go's errors.As stops at that branch and sends
// UNKNOWN without details. status.WithoutEffect of an error without a
// status is such a branch (its GRPCStatus is nil, on purpose).
//
// Here a handler joins a clean-up error it declared without effect with a
// refusal: OutcomeOf, RetryAfter, IsFinal and Pushback on the handler's
// error say NOT_ADMITTED QUEUE_FULL, retry after 1s; the client receives
// UNKNOWN with no detail.
func TestJoinNilStatusBranch(t *testing.T) {
	local := make(chan status.Outcome, 1)
	conn := startServer(t, map[string]func(context.Context) error{
		"JoinRefuse": func(context.Context) error {
			err := errors.Join(
				status.WithoutEffect(errors.New("release lock: nothing held")),
				status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second)),
			)
			local <- status.OutcomeOf(err)
			return err
		},
	})
	var md metadata.MD
	err := invoke(conn, "JoinRefuse", &md)
	built := <-local
	got := status.OutcomeOf(err)
	require.Equal(t, built.Kind, got.Kind,
		"OutcomeOf of the handler's error: %v %v (%v); the client received %v (%v)",
		built.Kind, built.Reason, built.Code, got.Kind, grpcstatus.Convert(err).Code())
	require.Equal(t, built.Reason, got.Reason)
	require.Equal(t, built.Code, got.Code)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// OutcomeUnknown builds "an unresolved outcome: the call may or may not have
// had its effect, and must not be repeated before its state is queried", and
// WithReason "sets the reason of an OutcomeUnknown or Committed outcome".
// detailKind gives ATTEMPT_REQUEST_MISMATCH precedence over the detail's
// outcome, so an OUTCOME_UNKNOWN (or COMMITTED) built with that reason reads
// back as KindFailed — a definite error — both locally and after a real gRPC
// round trip. RequestMismatch is the only constructor meant to give that
// reading; WithReason does not refuse or remap the reason.
func TestUnknownWithMismatchReasonReadsFailed(t *testing.T) {
	conn := startServer(t, map[string]func(context.Context) error{
		"Unknown": func(context.Context) error {
			return status.OutcomeUnknown(nil, status.WithReason(status.ReasonAttemptRequestMismatch))
		},
		"Committed": func(context.Context) error {
			return status.Committed(status.WithReason(status.ReasonAttemptRequestMismatch))
		},
	})
	for method, want := range map[string]status.Kind{"Unknown": status.KindUnknown, "Committed": status.KindCommitted} {
		var md metadata.MD
		err := invoke(conn, method, &md)
		require.Equal(t, want, status.OutcomeOf(err).Kind, "%s built with WithReason(ATTEMPT_REQUEST_MISMATCH) reads %v",
			method, status.OutcomeOf(err).Kind)
	}
}

// The zero Error is no success: grpc-go would answer a call with code OK.
// A review found it crossed gRPC so (its code is OK); it is now UNKNOWN.
func TestZeroErrorIsNoSuccess(t *testing.T) {
	var zero status.Error
	st := zero.GRPCStatus()
	require.NotNil(t, st)
	require.Equal(t, codes.Unknown, st.Code())
	require.Equal(t, status.KindUnknown, status.OutcomeOf(st.Err()).Kind)
}

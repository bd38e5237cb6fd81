package status_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// r14bDetailsWire is what err's details take in its status as sent.
func r14bDetailsWire(err error) int {
	return proto.Size(&spb.Status{Details: grpcstatus.Convert(err).Proto().GetDetails()})
}

// r14bFiller is a DebugInfo detail that takes n bytes in a status as sent.
func r14bFiller(t testing.TB, n int) *anypb.Any {
	for k := n; k > 0; k-- {
		a, err := anypb.New(&errdetails.DebugInfo{Detail: strings.Repeat("d", k)})
		require.NoError(t, err)
		if proto.Size(&spb.Status{Details: []*anypb.Any{a}}) <= n {
			return a
		}
	}
	t.Fatal("no filler")
	return nil
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// Bounded keeps a status's details in their order while they fit in 3 KiB
// and drops the rest, whatever they are. A tollgate OutcomeDetail is what
// OutcomeOf classifies an error by, before its code; one that comes after
// a large detail (a FAILED record written by another build or by a store's
// own writer, which the server now replays through Bounded) is dropped
// while the less important detail before it is kept, and the error's
// outcome changes: a status that read COMMITTED (or NOT_ADMITTED, or
// UNKNOWN) reads FAILED by its code once bounded, and an owner ends the
// call with a definite error the record never said. The OutcomeDetail
// OutcomeOf reads is now kept first, and the others while they fit in what
// remains.
func TestR14bBoundKeepsTheTollgateDetailFirst(t *testing.T) {
	big := r14bFiller(t, 3<<10-8) // leaves no room for the OutcomeDetail
	committed := grpcstatus.Convert(status.Committed(status.WithAttempt("0190a5b2-7c3e-7def-8123-456789abcdef", "0", 2))).Proto()
	for _, tc := range []struct {
		name    string
		details []*anypb.Any
	}{
		{"after a large detail", append([]*anypb.Any{big}, committed.GetDetails()...)},
		{"first", append(append([]*anypb.Any{}, committed.GetDetails()...), big)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := grpcstatus.ErrorProto(&spb.Status{Code: committed.GetCode(), Message: strings.Repeat("m", 4<<10), Details: tc.details})
			want := status.OutcomeOf(err)
			require.Equal(t, status.KindCommitted, want.Kind)

			bounded := status.Bounded(err)
			require.Equal(t, grpcstatus.Code(err), grpcstatus.Code(bounded))
			require.LessOrEqual(t, r14bDetailsWire(bounded), 3<<10)
			got := status.OutcomeOf(bounded)
			require.Equal(t, want.Kind, got.Kind, "the bound keeps the outcome")
			require.Equal(t, want.Reason, got.Reason)
			require.True(t, proto.Equal(want.Detail, got.Detail), "want %v, got %v", want.Detail, got.Detail)
		})
	}
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// Bounded rebuilds an oversized status with its code as it is, and
// grpc-go's ErrorProto returns nil for code OK: an error whose status
// claims OK (a non-nil error, which OutcomeOf reads as UNKNOWN, not a
// success) and whose message or details exceed the bound became nil, a
// success. It is now UNKNOWN, as OutcomeOf reads it.
func TestR14bBoundNeverTurnsAnErrorIntoSuccess(t *testing.T) {
	err := okStatusError{grpcstatus.New(codes.OK, strings.Repeat("m", 4<<10))}
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind)
	bounded := status.Bounded(err)
	require.Error(t, bounded)
	require.Equal(t, codes.Unknown, grpcstatus.Code(bounded))
	require.Equal(t, status.KindUnknown, status.OutcomeOf(bounded).Kind)
}

type okStatusError struct{ st *grpcstatus.Status }

func (e okStatusError) Error() string                  { return e.st.Message() }
func (e okStatusError) GRPCStatus() *grpcstatus.Status { return e.st }

// FuzzBounded bounds arbitrary google.rpc.Status bytes, as the server bounds
// a handler's definite error and a FAILED record it replays, whatever wrote
// it: nothing panics, the code is kept, the message is valid UTF-8 within
// 1 KiB as grpc-message sends it, the details fit 3 KiB (a tollgate detail
// too large for them kept by what it says), and the error reads as the same
// outcome, with the same retry-after.
func FuzzBounded(f *testing.F) {
	big := r14bFiller(f, 3<<10-8)
	for _, err := range []error{
		status.Committed(status.WithAttempt("a", "0", 1)),
		status.OutcomeUnknown(grpcstatus.Error(codes.Internal, strings.Repeat("é", 2000))),
		grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.InvalidArgument), Message: strings.Repeat("x", 3000),
			Details: append([]*anypb.Any{big}, grpcstatus.Convert(status.NotAdmitted(status.ReasonQueueFull)).Proto().GetDetails()...)}),
		grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: "m",
			Details: append([]*anypb.Any{big}, grpcstatus.Convert(status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second))).Proto().GetDetails()...)}),
	} {
		b, err := proto.Marshal(grpcstatus.Convert(err).Proto())
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
		require.Error(t, bounded)
		require.Equal(t, grpcstatus.Code(err), grpcstatus.Code(bounded))
		st := grpcstatus.Convert(bounded)
		require.True(t, utf8.ValidString(st.Message()))
		require.LessOrEqual(t, grpcMessageSize(st.Message()), 1<<10)
		want, got := status.OutcomeOf(err), status.OutcomeOf(bounded)
		require.Equal(t, want.Kind, got.Kind)
		require.Equal(t, want.Reason, got.Reason)
		require.Equal(t, want.Final(), got.Final())
		if r14bDetailsWire(err) <= 3<<10 {
			require.True(t, proto.Equal(want.Detail, got.Detail))
		} else if want.Detail != nil {
			// A tollgate detail too large for the bound is kept by what it
			// says (see TestR14cBoundedBoundsAHugeTollgateDetail).
			w, g := want.Detail, got.Detail
			require.Equal(t, w.GetTry(), g.GetTry())
			require.Equal(t, w.GetFencedThroughTry(), g.GetFencedThroughTry())
			require.Equal(t, w.GetUnitsRemaining(), g.GetUnitsRemaining())
			// Its strings as OutcomeOf reads them, which bounds them
			// (TestR15OutcomeBoundsAPeersIdentifiers).
			require.Equal(t, w.GetAttemptId(), g.GetAttemptId())
			require.Equal(t, w.GetCall(), g.GetCall())
			require.Equal(t, w.GetWorkloadClass(), g.GetWorkloadClass())
			require.True(t, proto.Equal(w.GetRetryAfter(), g.GetRetryAfter()) || len(w.GetRetryAfter().ProtoReflect().GetUnknown()) > 0)
		}
		require.LessOrEqual(t, r14bDetailsWire(bounded), 3<<10)
		wantDelay, wantOK := status.RetryAfter(err)
		gotDelay, gotOK := status.RetryAfter(bounded)
		require.Equal(t, wantOK, gotOK, "the bound keeps the retry-after (TestR14dBoundedKeepsTheRetryInfo)")
		require.Equal(t, wantDelay, gotDelay)
	})
}

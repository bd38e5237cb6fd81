package status_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// FuzzOutcomeOf reads arbitrary google.rpc.Status bytes, as a client reads
// grpc-status-details-bin from any peer: nothing may panic, every Kind is
// valid, and the functions agree with each other.
func FuzzOutcomeOf(f *testing.F) {
	for _, err := range []error{
		status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(1500*time.Millisecond),
			status.WithClass("heavy"), status.WithAttempt("0190a5b2-7c3e-7def-8123-456789abcdef", "0.2.1", 2)),
		status.NotAdmitted(status.ReasonAttemptFenced, status.WithFencedThroughTry(3), status.WithUnitsRemaining(-1)),
		status.NotAdmitted(status.ReasonMalformedHeader),
		status.OutcomeUnknown(context.DeadlineExceeded, status.WithReason(status.ReasonCallLost)),
		status.Committed(status.WithAttempt("a", "0", 1)),
		status.RequestMismatch(tollgatev1.Outcome_OUTCOME_NOT_ADMITTED),
		grpcstatus.Error(codes.NotFound, "no such thing"),
	} {
		b, err := proto.Marshal(grpcstatus.Convert(err).Proto())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	corrupt, _ := proto.Marshal(&spb.Status{Code: int32(codes.ResourceExhausted), Details: []*anypb.Any{
		{TypeUrl: "type.googleapis.com/tollgate.v1.OutcomeDetail", Value: []byte{0x08, 0x01, 0x32, 0x03, 0x08}},
	}})
	f.Add(corrupt)
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, b []byte) {
		var p spb.Status
		if proto.Unmarshal(b, &p) != nil {
			t.Skip()
		}
		err := grpcstatus.FromProto(&p).Err()
		for _, e := range []error{err, fmt.Errorf("max retries exhausted: failed after %d attempts: %w", 2, err), status.WithoutEffect(err)} {
			check(t, e)
		}
	})
}

func check(t *testing.T, err error) {
	o := status.OutcomeOf(err)
	validKind(t, o.Kind)
	if err == nil {
		if o.Kind != status.KindOK {
			t.Fatalf("nil error is %v", o.Kind)
		}
		return
	}
	if o.Kind == status.KindOK {
		t.Fatalf("non-nil error %v is OK", err)
	}
	for _, d := range []status.Delivery{status.MaybeSent, status.NotSent, status.PeerStatus} {
		oc := status.OutcomeOfCall(err, d)
		validKind(t, oc.Kind)
		if o.Detail != nil && oc.Kind != o.Kind {
			t.Fatalf("the detail decides: OutcomeOf %v, OutcomeOfCall(%v) %v", o.Kind, d, oc.Kind)
		}
	}
	for _, nse := range []bool{false, true} {
		h := status.HandlerOutcome(err, nse)
		validKind(t, h.Kind)
		if h.Kind == status.KindCommitted || h.Kind == status.KindOK {
			t.Fatalf("a handler's error is %v", h.Kind)
		}
		if h.Kind == status.KindNotAdmitted && o.Kind != status.KindNotAdmitted {
			t.Fatalf("HandlerOutcome made %v NOT_ADMITTED", o.Kind)
		}
	}
	d, ok := status.RetryAfter(err)
	if ok != (d > 0) {
		t.Fatalf("RetryAfter %v, %v", d, ok)
	}
	if status.IsFinal(err) != o.Final() {
		t.Fatalf("IsFinal disagrees with OutcomeOf")
	}
	if v, ok := status.Pushback(err); ok {
		ms, perr := strconv.ParseInt(v, 10, 64)
		_, delayed := status.RetryAfter(err)
		if perr != nil || o.Kind != status.KindNotAdmitted || (delayed && ms <= 0) || (!delayed && (!o.Final() || ms != -1)) {
			t.Fatalf("pushback %q for %v", v, o.Kind)
		}
	}
	var te *status.Error
	if errors.As(err, &te) {
		t.Fatalf("a received status is not a *status.Error")
	}
}

func validKind(t *testing.T, k status.Kind) {
	if k.String() == "INVALID" {
		t.Fatalf("invalid kind %d", k)
	}
}

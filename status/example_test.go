package status_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

func ExampleNotAdmitted() {
	err := status.NotAdmitted(status.ReasonQueueFull,
		status.WithRetryAfter(1500*time.Millisecond), status.WithClass("heavy"))

	st := grpcstatus.Convert(err) // what grpc-go sends
	fmt.Println(st.Code(), st.Message())
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			fmt.Println("ErrorInfo:", d.GetDomain(), d.GetReason())
		case *errdetails.RetryInfo:
			fmt.Println("RetryInfo:", d.GetRetryDelay().AsDuration())
		}
	}
	pushback, _ := status.Pushback(err)
	fmt.Println("grpc-retry-pushback-ms:", pushback)
	// Output:
	// ResourceExhausted tollgate: not admitted: queue full
	// ErrorInfo: tollgate.dev QUEUE_FULL
	// RetryInfo: 1.5s
	// grpc-retry-pushback-ms: 1500
}

func ExampleOutcomeOf() {
	// A refusal as a client receives it, wrapped by grpc-go's own retry.
	sent := status.NotAdmitted(status.ReasonDraining, status.WithRetryAfter(time.Second))
	received := grpcstatus.Convert(sent).Err()
	err := fmt.Errorf("max retries exhausted: failed after %d attempts: %w", 3, received)

	o := status.OutcomeOf(err)
	d, _ := status.RetryAfter(err)
	fmt.Println(o.Kind, status.ReasonName(o.Reason), o.Code, d)

	fmt.Println(status.OutcomeOf(grpcstatus.Error(codes.NotFound, "no such order")).Kind)
	fmt.Println(status.OutcomeOf(grpcstatus.Error(codes.Internal, "boom")).Kind)
	// Output:
	// NOT_ADMITTED DRAINING Unavailable 1s
	// FAILED
	// UNKNOWN
}

func ExampleOutcomeOfCall() {
	for _, err := range []error{
		grpcstatus.Error(codes.Unavailable, "connection refused"),
		grpcstatus.Error(codes.NotFound, "no such order"),
	} {
		for _, d := range []status.Delivery{status.NotSent, status.MaybeSent, status.PeerStatus} {
			o := status.OutcomeOfCall(err, d)
			fmt.Println(o.Code, d, o.Kind, status.ReasonName(o.Reason))
		}
	}
	// Output:
	// Unavailable NOT_SENT NOT_ADMITTED NOT_SENT
	// Unavailable MAYBE_SENT UNKNOWN CALL_LOST
	// Unavailable PEER_STATUS UNKNOWN UNSPECIFIED
	// NotFound NOT_SENT FAILED UNSPECIFIED
	// NotFound MAYBE_SENT UNKNOWN CALL_LOST
	// NotFound PEER_STATUS FAILED UNSPECIFIED
}

func ExampleHandlerOutcome() {
	// A handler's downstream call was refused before the handler changed anything.
	below := status.NotAdmitted(status.ReasonShed)

	fmt.Println(status.HandlerOutcome(below, false).Kind)                       // it ran: an effect may have happened
	fmt.Println(status.HandlerOutcome(status.WithoutEffect(below), false).Kind) // it says it did nothing
	fmt.Println(status.HandlerOutcome(below, true).Kind)                        // a NO_SIDE_EFFECTS method
	fmt.Println(status.HandlerOutcome(errors.New("boom"), false).Kind)
	// Output:
	// UNKNOWN
	// NOT_ADMITTED
	// NOT_ADMITTED
	// UNKNOWN
}

func ExampleOutcomeUnknown() {
	err := status.OutcomeUnknown(grpcstatus.Error(codes.Unavailable, "connection reset"),
		status.WithReason(status.ReasonCallLost), status.WithAttempt("0190a5b2-7c3e-7def-8123-456789abcdef", "0", 1))
	o := status.OutcomeOf(err)
	fmt.Println(grpcstatus.Code(err), o.Kind, status.ReasonName(o.Reason), o.Detail.GetAttemptId())
	// Output:
	// Unknown UNKNOWN CALL_LOST 0190a5b2-7c3e-7def-8123-456789abcdef
}

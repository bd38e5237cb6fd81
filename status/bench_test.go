package status_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/status"
	grpcstatus "google.golang.org/grpc/status"
)

var (
	sinkErr     error
	sinkStatus  *grpcstatus.Status
	sinkOutcome status.Outcome
)

// BenchmarkNotAdmitted measures building a typical refusal.
func BenchmarkNotAdmitted(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		sinkErr = status.NotAdmitted(status.ReasonQueueFull,
			status.WithRetryAfter(1500*time.Millisecond), status.WithClass("heavy"))
	}
}

// BenchmarkGRPCStatus measures turning a refusal into the status grpc-go sends.
func BenchmarkGRPCStatus(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		err := status.NotAdmitted(status.ReasonQueueFull,
			status.WithRetryAfter(1500*time.Millisecond), status.WithClass("heavy"))
		sinkStatus, _ = grpcstatus.FromError(err)
	}
}

// BenchmarkOutcomeOf measures classifying errors as a client receives them.
func BenchmarkOutcomeOf(b *testing.B) {
	refusal := status.NotAdmitted(status.ReasonQueueFull,
		status.WithRetryAfter(1500*time.Millisecond), status.WithClass("heavy"))
	st, _ := grpcstatus.FromError(refusal)
	received := st.Err() // as a client receives it: details in a plain grpc status
	cases := []struct {
		name string
		err  error
	}{
		{"Error", refusal},
		{"Received", received},
		{"Wrapped", fmt.Errorf("max retries exhausted: failed after %d attempts: %w", 3, received)},
		{"NoDetail", grpcstatus.Error(5, "not found")},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkOutcome = status.OutcomeOf(c.err)
			}
		})
	}
}

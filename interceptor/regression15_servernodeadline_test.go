package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc/metadata"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §3.1: every hop's context deadline is ≤ d + skew, and "a request
// with no deadline gets the server's maximum"; no layer extends the deadline.
// A trusted peer whose tollgate header carries no "d" (the field is optional
// on the wire) but whose request has a grpc-timeout of 1 s has a deadline:
// the server must not make the attempt's deadline its 30 s maximum. Without a
// store the handler's context still ends at the grpc-timeout, but the
// attempt's deadline (which the handler's outbound calls carry as "d") is
// 30 s; with a store the handler runs detached until that 30 s, far past
// the only deadline the caller ever gave. A caller without a header (or an
// untrusted one) gets its grpc-timeout as the attempt's deadline.
func TestRegression15ServerNoDeadlineField(t *testing.T) {
	for _, withStore := range []bool{false, true} {
		name := "no-store"
		if withStore {
			name = "store"
		}
		t.Run(name, func(t *testing.T) {
			type seenT struct {
				attempt time.Time
				ctx     time.Time
			}
			seen := make(chan seenT, 1)
			svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				a, _ := interceptor.AttemptFromContext(ctx)
				d, _ := ctx.Deadline()
				seen <- seenT{a.Deadline, d}
				return &testingv1.ApplyResponse{}, nil
			}}
			opts := []interceptor.ServerOption{interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0)}
			var store idempotency.Store
			if withStore {
				store = memoryStore(t)
				opts = append(opts, interceptor.WithAttemptStore(store))
			}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(opts...)...)
			client := testingv1.NewTestServiceClient(end.DialT(t))

			id, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
			require.NoError(t, err)
			a, _ := interceptor.AttemptFromContext(id)
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			reqDeadline, _ := ctx.Deadline()
			ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", "a="+a.ID+";c=0;t=1")
			_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
			require.NoError(t, err)
			s := <-seen
			slack := 100 * time.Millisecond
			require.False(t, s.ctx.After(reqDeadline.Add(slack)),
				"the handler's context runs until %v, past the request's deadline %v", s.ctx, reqDeadline)
			require.False(t, s.attempt.After(reqDeadline.Add(slack)),
				"the attempt's deadline became %v (the server's maximum), past the request's deadline %v", s.attempt, reqDeadline)
		})
	}
}

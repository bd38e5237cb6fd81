package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
)

// WithAttemptTimeout is the deadline of an attempt this client mints, and
// only of that one: a client used inside handlers sends every call under
// its caller's attempt and deadline, and one used under StartAttempt under
// that attempt's. A minimum try time (or hop margin) at or above the
// default attempt timeout, which such a client never applies, worked and
// was refused by NewDialOptions once it was checked against the default:
// a batch service whose calls need 15 s, called by handlers of
// attempts that last up to 30 s, could no longer build its client.
func TestMinTryTimeAboveTheDefaultAttemptTimeoutWorksBelowTheOrigin_r18y(t *testing.T) {
	// 15 s: above the 10 s default attempt timeout, below the 30 s a server
	// caps an attempt at by default (DefaultMaxAttemptTime).
	slow := []interceptor.ClientOption{interceptor.WithMinTryTime(15 * time.Second)}
	_, err := interceptor.NewDialOptions(slow...)
	require.NoError(t, err, "a client that mints no attempt never applies the default attempt timeout")
	_, err = interceptor.NewDialOptions(interceptor.WithHopMargin(interceptor.DefaultAttemptTimeout))
	require.NoError(t, err)

	// Inside a handler: the origin's attempt lasts an hour.
	tr := newTiers(t, []interceptor.ClientOption{interceptor.WithAttemptTimeout(time.Hour)}, slow, okGet)
	resp, err := tr.origin.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	require.NoError(t, err)
	require.Equal(t, "v", resp.GetValue())

	// Under StartAttempt: the attempt's timeout is StartAttempt's.
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{GetFunc: okGet}).Register, serverOpts()...)
	c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(slow...)...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, time.Hour)
	require.NoError(t, err)
	_, err = c.Get(ctx, &testingv1.GetRequest{Key: "k"})
	require.NoError(t, err)

	// Set explicitly, an attempt timeout the margins leave no time in is
	// still refused: every attempt the client mints would be.
	_, err = interceptor.NewDialOptions(interceptor.WithMinTryTime(time.Minute), interceptor.WithAttemptTimeout(time.Minute))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption)
}

package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §3.7: records live "TTL counted from the last write, ≥ the
// server's maximum attempt deadline + skew + grace". ServerOptions checks
// that the store's policy has the server's clock skew (a store that tells
// its Policy), but not that its TTL (or MaxAttemptDeadline, "the longest
// attempt deadline the server accepts") covers WithMaxAttemptTime: a server
// accepting 10-minute attempts in front of a store that keeps records 5
// minutes is built without a word, and its calls made after the first 5
// minutes of an attempt are refused ATTEMPT_UNVERIFIABLE (see
// TestRegression15ServerOldAttempt).
func TestRegression15ServerMaxAttempt(t *testing.T) {
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica) // DefaultPolicy: MaxAttemptDeadline 2 min, TTL 5 min
	require.NoError(t, err)
	p := store.Policy()
	_, err = interceptor.NewServerOptions(interceptor.WithAttemptStore(store),
		interceptor.WithMaxAttemptTime(10*time.Minute))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption,
		"a 10 min maximum attempt time with a store whose TTL is %v (MaxAttemptDeadline %v) was accepted", p.TTL, p.MaxAttemptDeadline)
}

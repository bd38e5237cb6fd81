package interceptor_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
)

// policyStore is a third-party store that tells its policy (WithAttemptStore:
// "a store that tells its policy (a Policy() idempotency.Policy method …) is
// checked"), here one whose policy was never filled in beyond its skew.
type policyStore struct {
	*idempotency.MemoryStore
	pol idempotency.Policy
}

func (s policyStore) Policy() idempotency.Policy { return s.pol }

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// 48aa2a2 lowers the default maximum attempt time to the store policy's
// MaxAttemptDeadline. validate() checks maxAttemptTime ∈ (0, 24h] before
// that lowering, and nothing checks the lowered value, nor the policy
// (idempotency.Policy.Validate exists but is not called): a store whose policy
// says MaxAttemptDeadline 0 (or negative) makes a server whose maximum
// attempt time is 0. Before 48aa2a2 that configuration was refused
// ErrInvalidOption ("maximum attempt time 30s exceeds the attempt store's
// policy MaxAttemptDeadline 0s"); now NewServerOptions accepts it, and every
// request without an earlier deadline is given one of now + skew
// (DESIGN.md §3.1: "a request with no deadline gets the server's maximum").
func TestRegression15OptionsZeroPolicy(t *testing.T) {
	store := policyStore{MemoryStore: memoryStore(t), pol: idempotency.Policy{Skew: 0}}
	_, err := interceptor.NewServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0))
	require.Error(t, err, "a store policy with MaxAttemptDeadline 0 gave the server a maximum attempt time of 0")
	require.True(t, errors.Is(err, interceptor.ErrInvalidOption), "%v", err)
}

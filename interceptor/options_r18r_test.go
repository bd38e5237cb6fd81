package interceptor_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
)

// An operator found WithAttemptStore(nil) accepted as no store, while a
// typed nil (a nil *MemoryStore, say) is ErrInvalidOption: a nil store
// given on purpose is as likely a variable never set. Both are refused now,
// and the error says to pass no WithAttemptStore for none.
func TestWithAttemptStoreNilIsInvalid(t *testing.T) {
	for name, store := range map[string]idempotency.Store{
		"nil":       nil,
		"typed nil": (*idempotency.MemoryStore)(nil),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := interceptor.NewServerOptions(interceptor.WithAttemptStore(store))
			require.ErrorIs(t, err, interceptor.ErrInvalidOption)
			require.ErrorContains(t, err, "pass no WithAttemptStore for none")
		})
	}
	// A later store replaces an earlier nil one, as any option's later value.
	mem, err := idempotency.NewMemoryStore(idempotency.SingleReplica)
	require.NoError(t, err)
	_, err = interceptor.NewServerOptions(interceptor.WithAttemptStore(nil), interceptor.WithAttemptStore(mem))
	require.NoError(t, err)
}

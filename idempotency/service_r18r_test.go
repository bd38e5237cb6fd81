package idempotency_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
)

// An operator found that NewAttemptService, documented to panic on a nil
// store, accepted a typed nil (a nil *redisstore.Store in a Store
// interface): the server crashed on its first query instead, with a nil
// pointer dereference in GetAttempt. It now panics at construction for a
// nil interface and for one holding a nil pointer alike.
func TestNewAttemptServiceNilStorePanics(t *testing.T) {
	require.PanicsWithValue(t, "idempotency: NewAttemptService needs a store", func() { idempotency.NewAttemptService(nil) })
	require.Panics(t, func() { idempotency.NewAttemptService((*idempotency.MemoryStore)(nil)) },
		"a typed nil store was accepted, to crash on the first query")
}

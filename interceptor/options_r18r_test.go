package interceptor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
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

// unavailableStore is a memory store whose Begin fails as a store that
// cannot be reached does, with an error wrapping ErrStoreUnavailable.
type unavailableStore struct{ *idempotency.MemoryStore }

func (unavailableStore) Begin(context.Context, idempotency.BeginRequest) (idempotency.BeginResult, error) {
	return idempotency.BeginResult{}, fmt.Errorf("%w: redisstore: dial tcp 127.0.0.1:1: connection refused", idempotency.ErrStoreUnavailable)
}

// An operator found the refusal of a try whose Begin failed saying "store
// unavailable" twice: the reason's words, then the store error's sentinel.
// It says them once; the store's own words follow.
func TestStoreUnavailableSaysItOnce(t *testing.T) {
	ledger := newLedger(nil)
	end := testsvc.StartT(t, testsvc.Bufconn, ledger.Register, serverOpts(
		interceptor.WithAttemptStore(unavailableStore{memoryStore(t)}))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	id, err := uuid.NewV7()
	require.NoError(t, err)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+id.String()+";d="+itoa(time.Now().Add(5*time.Second).UnixMilli()))
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "a", Amount: 1})
	require.Equal(t, status.ReasonStoreUnavailable, status.OutcomeOf(err).Reason, "%v", err)
	msg := grpcstatus.Convert(err).Message()
	require.Equal(t, 1, strings.Count(msg, "store unavailable"), "%q", msg)
	require.Contains(t, msg, "connection refused")
}

package interceptor_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
)

// A review found that grpc.MaxConcurrentStreams, which ServerOptions sets
// per connection, could be at or below the streams admission holds at once
// (every class's slots and queue items): a connection whose data path
// filled them then had no stream left, and a control call on it — an
// AttemptService query, which a tollgate client sends on the very
// connection of the call it resolves, or a health check — waited on the
// client for a stream (TestMaxConcurrentStreamsBoundsAConnection) while
// the control class sat idle (DESIGN.md §3.12: the control path stays
// open). The default grows to leave room.
func TestMaxConcurrentStreamsLeavesRoomForTheControlPath(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 2, QueueItems: 2}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	require.Equal(t, 2+2+2+8, ctrl.Capacity(), "work's 2+2 and the built-in control class's 2+8")

	// An explicit bound is the operator's, even one that leaves no room
	// (a review of the first version, which refused it, found servers
	// behind proxies legitimately below capacity failing to start).
	_, err = interceptor.NewServerOptions(interceptor.WithAdmission(ctrl), interceptor.WithMaxConcurrentStreams(14))
	require.NoError(t, err)
	require.Equal(t, uint32(14), interceptor.MaxStreams(interceptor.WithAdmission(ctrl), interceptor.WithMaxConcurrentStreams(14)))
	require.Equal(t, uint32(3), interceptor.MaxStreams(interceptor.WithAdmission(ctrl), interceptor.WithMaxConcurrentStreams(3)))

	big, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 600, QueueItems: 600}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = big.Close() })
	_, err = interceptor.NewServerOptions(interceptor.WithAdmission(big)) // the default follows admission
	require.NoError(t, err)
	require.Equal(t, uint32(600+600+2+8+1), interceptor.MaxStreams(interceptor.WithAdmission(big)), "one stream beyond what admission holds")
	require.Equal(t, uint32(interceptor.DefaultMaxStreams), interceptor.MaxStreams(interceptor.WithAdmission(ctrl)), "a default already above admission's 14 stays")
}

// The review of that change found the default's growth inside validate's
// switch: the case that raised it matched and ended the switch, so a server
// whose admission held more than 1024 streams skipped the checks after it
// and started with a typed-nil store or a nil provider, to panic later.
func TestRaisedStreamDefaultStillValidatesTheRest(t *testing.T) {
	big, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 600, QueueItems: 600}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = big.Close() })
	_, err = interceptor.NewServerOptions(interceptor.WithAdmission(big),
		interceptor.WithAttemptStore((*idempotency.MemoryStore)(nil)))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption, "a typed-nil store is refused whatever the stream bound")
	_, err = interceptor.NewServerOptions(interceptor.WithAdmission(big), interceptor.WithServerMeterProvider(nil))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption, "a nil meter provider is refused whatever the stream bound")
}

package admission_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/tap"
)

// The tap refused health checks when AttemptService queries (waiting on a
// slow store, say) filled the control class: an orchestrator would then
// restart a server whose data path is healthy. Health, answered from memory,
// is never refused at the tap; AttemptService still is.
func TestRegression13TapNeverRefusesHealth(t *testing.T) {
	c, err := admission.New(admission.WithClasses(
		admission.Class{Name: admission.ControlClass, Slots: 1},
		admission.Class{Name: "work", Slots: 1}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	p, err := c.Admit(ctx, admission.Request{Method: "/tollgate.v1.AttemptService/GetAttempt", Size: -1})
	require.NoError(t, err)
	defer p.Release()
	_, err = c.TapHandle(ctx, &tap.Info{FullMethodName: "/tollgate.v1.AttemptService/FenceAttempt"})
	require.Equal(t, status.ReasonConcurrencyFull, status.OutcomeOf(err).Reason, "the control class is full: %v", err)
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"} {
		_, err = c.TapHandle(ctx, &tap.Info{FullMethodName: m})
		require.NoError(t, err, m)
	}
}

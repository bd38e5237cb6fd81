package interceptor_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// connectNow connects conn and waits until it is ready, so that a test's
// short deadline is spent on its call rather than on connecting (a try that
// never left the client is NOT_SENT), however slowly a loaded machine
// connects.
func connectNow(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	conn.Connect()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		require.True(t, conn.WaitForStateChange(t.Context(), st), "connecting")
	}
}

package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
)

// A review found that a server stream that completed (every message and
// the OK status arrived, unread) before the caller's context reached its
// deadline lost its messages and its success: grpc-go still hands the
// caller every message and io.EOF, but tollgate's abandon (the context's
// AfterFunc) ended the stream at the deadline whatever had arrived.
func TestRegression14eStreamCompletedBeforeDeadlineKeepsItsMessages(t *testing.T) {
	for _, tollgate := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain grpc-go", true: "tollgate"}[tollgate], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, st, finished := completedUnreadWatch(t, ctx, tollgate)
			<-ctx.Done() // the caller was slow: its deadline passed before it read
			select {
			case err := <-finished:
				t.Logf("OnFinish ran with %v", err)
			case <-time.After(2 * time.Second):
				t.Log("OnFinish did not run after the deadline")
			}
			got, err := recvAll(st)
			require.NoError(t, err, "a stream that had ended OK before the deadline: %v", status.OutcomeOf(err))
			require.Equal(t, []string{"0", "1", "2"}, got)
		})
	}
}

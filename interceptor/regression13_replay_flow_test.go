package interceptor_test

import (
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// Regression (review 72): a repeat's replay runs inside the caller's RecvMsg
// while it holds the stream's lock (clientStream.settleLocked →
// tryFromLocked → replayLocked), so while it replays nobody reads the new
// try's responses. A bidi handler that answers each message as it reads it
// (an echo with a larger answer) stops reading once HTTP/2 flow control stops
// its answers; the replay then blocks in SendMsg, and the stream hangs until
// the attempt's deadline, though the caller receives on its own goroutine, as
// grpc.ClientStream allows, and the same exchange without tollgate (or
// without the repeat) completes. Flow-control windows are pinned to
// grpc-go's default so that the BDP estimator does not grow them.
//
// Expected: the repeat is transparent and the stream completes. Observed:
// the stream ends at the attempt's deadline with an error.
func TestRegression13ReplayDoesNotBlockOnFlowControl(t *testing.T) {
	t.Run("control: no repeat", func(t *testing.T) { replayFlow(t, false) })
	t.Run("repeat", func(t *testing.T) { replayFlow(t, true) })
}

func replayFlow(t *testing.T, refuseFirst bool) {
	const (
		msgs    = 14
		reqSize = 16 << 10  // 224 KiB in all: under StreamReplayLimit
		resSize = 256 << 10 // each answer more than one window
		window  = 64 << 10  // grpc-go's default; pinned, so BDP is off
	)
	rec := &recorder{}
	answer := strings.Repeat("r", resSize)
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		run := rec.start()
		if !refuseFirst {
			run++
		}
		for {
			m, err := st.Recv()
			if err == io.EOF {
				if run == 0 {
					return shed()
				}
				return nil
			}
			if err != nil {
				return err
			}
			if run == 0 {
				rec.add(run, m.GetValue()[:2])
				if len(rec.all()[0]) == msgs {
					return shed() // refused, without effect, after reading everything
				}
				continue
			}
			if err := st.Send(&testingv1.ChatResponse{Value: answer}); err != nil {
				return err
			}
		}
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		append(serverOpts(), grpc.InitialWindowSize(window), grpc.InitialConnWindowSize(window))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithInitialWindowSize(window), grpc.WithInitialConnWindowSize(window))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	st, err := client.Chat(ctx)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var sendErr error
	wg.Go(func() {
		for i := range msgs {
			v := string(rune('a'+i)) + "-" + strings.Repeat("q", reqSize)
			if sendErr = st.Send(&testingv1.ChatRequest{Value: v}); sendErr != nil {
				return
			}
		}
		sendErr = st.CloseSend()
	})
	got := 0
	for {
		_, err := st.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "after %d answers", got)
		got++
	}
	wg.Wait()
	require.NoError(t, sendErr)
	require.Equal(t, msgs, got)
	want := 1
	if refuseFirst {
		want = 2
	}
	require.Len(t, rec.all(), want)
}

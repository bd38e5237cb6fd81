package interceptor_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A try that arrives after its attempt's deadline, of a call whose record
// is finished, is answered from the record (COMMITTED here) while the
// server is full, with or without the admission tap: the tap lets a try
// whose header says its deadline has passed through to the interceptor,
// which answers it from the record without a slot. The tap refused it
// CONCURRENCY_FULL, a repeatable NOT_ADMITTED for a call that committed.
func TestLateTryOfAFinishedCallIsAnsweredFromItsRecordPastTheTap(t *testing.T) {
	for _, tap := range []bool{false, true} {
		t.Run("tap="+strconv.FormatBool(tap), func(t *testing.T) {
			ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}), admission.WithDefaultClass("work"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ctrl.Close() })
			hold, release := make(chan struct{}), make(chan struct{})
			c := newConsumer()
			c.consume = func(r *testingv1.ConsumeRequest, st grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
				if r.GetKey() == "hold" {
					close(hold)
					<-release
				}
				return countingConsume(r, st)
			}
			extra := []interceptor.ServerOption{interceptor.WithAdmission(ctrl)}
			if !tap {
				extra = append(extra, interceptor.WithoutAdmissionTap())
			}
			conn := startRecorded(t, c, memoryStore(t), extra).DialT(t)
			client := testingv1.NewTestServiceClient(conn)
			actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
			require.NoError(t, err)
			a, _ := interceptor.AttemptFromContext(actx)
			d := time.Now().Add(300 * time.Millisecond)
			try := func(n int) context.Context {
				return metadata.AppendToOutgoingContext(t.Context(), "tollgate",
					"a="+a.ID+";d="+strconv.FormatInt(d.UnixMilli(), 10)+";c=feed;t="+strconv.Itoa(n)+";r=1")
			}

			st, err := client.Consume(try(1), &testingv1.ConsumeRequest{Key: "k", Count: 2})
			require.NoError(t, err)
			got, err := recvConsumed(st)
			require.NoError(t, err)
			require.Equal(t, []string{"0", "1"}, got)

			held := make(chan error, 1)
			go func() {
				st, err := client.Consume(t.Context(), &testingv1.ConsumeRequest{Key: "hold", Count: 1})
				if err == nil {
					_, err = recvConsumed(st)
				}
				held <- err
			}()
			<-hold
			defer func() { close(release); require.NoError(t, <-held) }()

			time.Sleep(time.Until(d) + 50*time.Millisecond) // past d (the test server's skew is 0)
			var trailer metadata.MD
			st, err = client.Consume(try(2), &testingv1.ConsumeRequest{Key: "k", Count: 2}, grpc.Trailer(&trailer))
			require.NoError(t, err)
			got, err = recvConsumed(st)
			require.Empty(t, got)
			require.Equal(t, status.KindCommitted, status.OutcomeOf(err).Kind, "%v", err)
			require.Equal(t, []string{"0"}, trailer.Get("tollgate-spent"))
			require.Equal(t, int64(2), c.runs.Load(), "the first try and the slot holder ran; the late try did not")
		})
	}
}

package interceptor_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// gateCodec is the proto codec, except that its marshalling of a ChatRequest
// whose value starts with "gate" stops, the times listed in hold (1: the
// first such marshalling), until the matching channel is closed: it stands
// for a slow marshal (a large message) at a chosen point. reached[i] is
// closed when marshalling number hold[i] starts.
type gateCodec struct {
	n       atomic.Int32
	hold    []int32
	reached []chan struct{}
	release []chan struct{}
}

func newGateCodec(hold ...int32) *gateCodec {
	c := &gateCodec{hold: hold}
	for range hold {
		c.reached = append(c.reached, make(chan struct{}))
		c.release = append(c.release, make(chan struct{}))
	}
	return c
}

func (c *gateCodec) Marshal(v any) ([]byte, error) {
	if m, ok := v.(*testingv1.ChatRequest); ok && strings.HasPrefix(m.GetValue(), "gate") {
		k := c.n.Add(1)
		for i, h := range c.hold {
			if h == k {
				close(c.reached[i])
				<-c.release[i]
			}
		}
	}
	return proto.Marshal(v.(proto.Message))
}

func (*gateCodec) Unmarshal(data []byte, v any) error {
	return proto.Unmarshal(data, v.(proto.Message))
}
func (*gateCodec) Name() string { return "proto" }

func (c *gateCodec) open() {
	for _, r := range c.release {
		select {
		case <-r:
		default:
			close(r)
		}
	}
}

// Regression (review 81, commit 26e03d7): the stream CloseSend and Trailer
// act on (streamSide.cur) becomes a repeat's stream only once its replay
// goroutine finished, and no longer before the repeat can be observed to
// end. A repeat that ends (here with a definite error, final) while its
// replay is still under way ends the stream, and the caller's RecvMsg
// returns try 2's status, but Trailer then returns try 1's trailer: the
// status and the trailer the caller reads belong to different tries. Before
// the commit the replay was done before any try's end could be seen.
//
// Expected: after RecvMsg returned the stream's status, Trailer is the
// trailer of the try that gave it ("run"="1"). Observed: "run"="0".
func TestRegression13TrailerAfterEndIsTheLastTrys(t *testing.T) {
	rec := &recorder{}
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		run := rec.start()
		if run == 0 {
			for {
				if _, err := st.Recv(); err != nil {
					break
				}
			}
			st.SetTrailer(metadata.Pairs("run", "0"))
			return shed() // without effect: repeated
		}
		st.SetTrailer(metadata.Pairs("run", "1"))
		return grpcstatus.Error(codes.InvalidArgument, "no") // definite: the stream's result
	}}
	codec := newGateCodec(2) // the replay's marshalling of "gate" waits
	t.Cleanup(codec.open)
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(codec)))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{Value: "gate"}))
	require.NoError(t, st.CloseSend())
	_, err = st.Recv()
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
	require.Len(t, rec.all(), 2)
	tr := st.Trailer()
	codec.open()
	require.Equal(t, []string{"1"}, tr.Get("run"), "the trailer of the try whose status RecvMsg returned")
}

// Regression (review 81, commit 26e03d7): a local SendMsg error (a message
// over MaxCallSendMsgSize) is typed only when no repeat started while the
// send was under way. When the caller's RecvMsg repeats the stream in the
// meantime (try 1 refused without effect), the new try's replay already
// holds the oversized message; SendMsg then returns grpc-go's bare
// RESOURCE_EXHAUSTED (gen != cs.gen, the stream not yet done), although the
// stream goes on, replays the earlier messages to a handler, and fails
// again on the same message: the very bare code commit 26e03d7 set out to
// remove (DESIGN.md §2.5), and an error from SendMsg that is not the
// stream's status.
//
// Expected: SendMsg's error is tollgate-typed (UNKNOWN naming the attempt),
// as without the repeat. Observed: bare RESOURCE_EXHAUSTED, no detail.
func TestRegression13LocalSendErrorDuringRepeatIsTyped(t *testing.T) {
	rec := &recorder{}
	firstRead := make(chan struct{})
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		run := rec.start()
		for {
			m, err := st.Recv()
			if err != nil {
				return err
			}
			rec.add(run, m.GetValue())
			if run == 0 {
				close(firstRead)
				return shed() // without effect: repeated
			}
		}
	}}
	// Marshalling 2 is the caller's send of the oversized message (1 is
	// "gate-small"), 4 is the replay's of it (3: the replay's "gate-small").
	codec := newGateCodec(2, 4)
	t.Cleanup(codec.open)
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(codec), grpc.MaxCallSendMsgSize(1024)))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(ctx)

	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{Value: "gate-small"}))
	<-firstRead
	sent := make(chan error, 1)
	go func() { sent <- st.Send(&testingv1.ChatRequest{Value: "gate" + strings.Repeat("x", 4096)}) }()
	<-codec.reached[0] // the caller's send is marshalling the big message on try 1
	// Only now the receiver, which repeats the stream: a repeat started
	// earlier would make its replay's "gate-small" marshalling number 2.
	var wg sync.WaitGroup
	var recvErr error
	wg.Go(func() { // the caller's receiver: it repeats the stream
		for {
			if _, recvErr = st.Recv(); recvErr != nil {
				return
			}
		}
	})
	select {
	case <-codec.reached[1]: // try 2's replay reached it
	case <-time.After(5 * time.Second):
		t.Fatal("no repeat")
	}
	close(codec.release[0])
	sendErr := <-sent
	codec.open()
	wg.Wait()

	t.Logf("SendMsg: %v; RecvMsg: %v; runs: %v", sendErr, recvErr, rec.all())
	require.Error(t, sendErr)
	o := status.OutcomeOf(sendErr)
	require.NotEqual(t, codes.ResourceExhausted, grpcstatus.Code(sendErr), "an UNKNOWN is never RESOURCE_EXHAUSTED (DESIGN.md §2.5): %v", sendErr)
	require.NotNil(t, o.Detail, "typed, naming the attempt: %v", sendErr)
	require.Equal(t, a.ID, o.Detail.GetAttemptId())
}

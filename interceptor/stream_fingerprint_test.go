package interceptor_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A recorded server-streaming call is begun before tollgate's stream
// interceptor calls the handler chain. When the protobuf registry knows the
// method's request type, the interceptor receives the one request first and
// fingerprints it with the method; TestService's Consume (a server-streaming
// method with side effects) takes that path under its registered name.
// Otherwise the fingerprint covers the method alone: recordedService is
// TestService registered under a service name the registry does not know, so
// that its Watch (NO_SIDE_EFFECTS under its own name) keeps records, and its
// request type is unknown.
const (
	recordedService = "tollgate.testing.v1.RecordedTestService"
	recordedWatch   = "/" + recordedService + "/Watch"
	consumeMethod   = testingv1.TestService_Consume_FullMethodName
)

// consumer is a TestService whose Consume runs consume and counts its runs;
// its other methods are the embedded testsvc.Service's.
type consumer struct {
	*testsvc.Service
	consume func(*testingv1.ConsumeRequest, grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error
	runs    atomic.Int64
}

func (c *consumer) Consume(r *testingv1.ConsumeRequest, st grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
	c.runs.Add(1)
	return c.consume(r, st)
}

func newConsumer() *consumer {
	return &consumer{Service: &testsvc.Service{WatchFunc: countingWatch}, consume: countingConsume}
}

// countingConsume sends the count of items asked for, or fails NOT_FOUND for
// the key "missing".
func countingConsume(r *testingv1.ConsumeRequest, st grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
	if r.GetKey() == "missing" {
		return grpcstatus.Error(codes.NotFound, "no such key")
	}
	for i := range r.GetCount() {
		if err := st.Send(&testingv1.ConsumeResponse{Value: strconv.Itoa(int(i))}); err != nil {
			return err
		}
	}
	return nil
}

// countingWatch is countingConsume for Watch.
func countingWatch(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
	if r.GetKey() == "missing" {
		return grpcstatus.Error(codes.NotFound, "no such key")
	}
	return sendWatch(st, r.GetCount())
}

// startRecorded serves c as TestService and as recordedService, with the
// store and its AttemptService, behind opts (tollgate's server options for
// the store and extra, then any grpc.ServerOption given in outer).
func startRecorded(t *testing.T, c *consumer, store idempotency.Store, extra []interceptor.ServerOption, outer ...grpc.ServerOption) *testsvc.Endpoint {
	t.Helper()
	desc := testingv1.TestService_ServiceDesc
	desc.ServiceName = recordedService
	opts := append(serverOpts(append([]interceptor.ServerOption{interceptor.WithAttemptStore(store)}, extra...)...), outer...)
	return testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		testingv1.RegisterTestServiceServer(s, c)
		s.RegisterService(&desc, c)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, opts...)
}

// recvConsumed reads a Consume to its end and returns the values and the
// error (nil for io.EOF).
func recvConsumed(st grpc.ServerStreamingClient[testingv1.ConsumeResponse]) ([]string, error) {
	var got []string
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, m.GetValue())
	}
}

// watchRecorded opens recordedService's Watch as generated client code does:
// the request is sent and the client's side closed.
func watchRecorded(ctx context.Context, conn *grpc.ClientConn, r *testingv1.WatchRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[testingv1.WatchResponse], error) {
	cs, err := conn.NewStream(ctx, &testingv1.TestService_ServiceDesc.Streams[0], recordedWatch, opts...)
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(r); err != nil {
		return nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, err
	}
	return &grpc.GenericClientStream[testingv1.WatchRequest, testingv1.WatchResponse]{ClientStream: cs}, nil
}

// An explicitly keyed server-streaming call re-run with another request is
// refused as a mismatch (DESIGN.md §2.2), whatever the record holds, and the
// handler does not run for it.
func TestExplicitKeyServerStreamWithAnotherRequestIsAMismatch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		first    *testingv1.ConsumeRequest
		firstErr codes.Code
		existing tollgatev1.Outcome
	}{
		{"succeeded", &testingv1.ConsumeRequest{Key: "k", Count: 2}, codes.OK, tollgatev1.Outcome_OUTCOME_COMMITTED},
		{"failed", &testingv1.ConsumeRequest{Key: "missing"}, codes.NotFound, tollgatev1.Outcome_OUTCOME_UNKNOWN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConsumer()
			end := startRecorded(t, c, memoryStore(t), nil)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
			actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)
			ctx := interceptor.WithCallKey(actx, "feed")

			st, err := client.Consume(ctx, tc.first)
			require.NoError(t, err)
			_, err = recvConsumed(st)
			require.Equal(t, tc.firstErr, grpcstatus.Code(err), "%v", err)
			require.Equal(t, int64(1), c.runs.Load())

			st, err = client.Consume(ctx, &testingv1.ConsumeRequest{Key: "k", Count: 3})
			require.NoError(t, err)
			got, err := recvConsumed(st)
			require.Empty(t, got, "no message of the other request's run")
			require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
			o := status.OutcomeOf(err)
			require.Equal(t, status.ReasonAttemptRequestMismatch, o.Reason, "%v", err)
			require.True(t, o.Final())
			require.Equal(t, tc.existing, o.Detail.GetOutcome(), "the mismatch says what the record holds")
			require.Equal(t, int64(1), c.runs.Load(), "the handler did not run for the other request")
		})
	}
}

// The same request re-run under the same explicit key is still answered from
// the record, without running the handler: COMMITTED for a stream that
// succeeded, the definite error for one that failed.
func TestExplicitKeyServerStreamWithTheSameRequestIsAnsweredFromItsRecord(t *testing.T) {
	for _, tc := range []struct {
		name    string
		req     *testingv1.ConsumeRequest
		want    []string
		wantErr func(t *testing.T, err error)
	}{
		{"succeeded", &testingv1.ConsumeRequest{Key: "k", Count: 2}, []string{"0", "1"}, func(t *testing.T, err error) {
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindCommitted, o.Kind, "%v", err)
			require.Equal(t, codes.FailedPrecondition, grpcstatus.Code(err))
		}},
		{"failed", &testingv1.ConsumeRequest{Key: "missing"}, nil, func(t *testing.T, err error) {
			require.Equal(t, codes.NotFound, grpcstatus.Code(err), "%v", err)
			require.Equal(t, "no such key", grpcstatus.Convert(err).Message())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConsumer()
			end := startRecorded(t, c, memoryStore(t), nil)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
			actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)
			ctx := interceptor.WithCallKey(actx, "feed")

			st, err := client.Consume(ctx, tc.req)
			require.NoError(t, err)
			got, err := recvConsumed(st)
			require.Equal(t, tc.want, got)
			if tc.want != nil {
				require.NoError(t, err)
			}

			st, err = client.Consume(ctx, tc.req)
			require.NoError(t, err)
			got, err = recvConsumed(st)
			require.Empty(t, got)
			tc.wantErr(t, err)
			require.Equal(t, int64(1), c.runs.Load(), "the record answered the re-run")
		})
	}
}

// A server-streaming method the registry does not know keeps the method-only
// fingerprint: an explicitly keyed re-run with another request is answered
// from the first run's record (here COMMITTED), not refused as a mismatch,
// and the handler runs once.
func TestServerStreamOfAnUnknownMethodFingerprintsTheMethodAlone(t *testing.T) {
	c := newConsumer()
	store := memoryStore(t)
	end := startRecorded(t, c, store, nil)
	conn := end.DialT(t, interceptor.DialOptions(fastRetry(3))...)
	actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	ctx := interceptor.WithCallKey(actx, "feed")

	st, err := watchRecorded(ctx, conn, &testingv1.WatchRequest{Key: "k", Count: 2})
	require.NoError(t, err)
	got, err := recvAll(st)
	require.NoError(t, err)
	require.Equal(t, []string{"0", "1"}, got)

	st, err = watchRecorded(ctx, conn, &testingv1.WatchRequest{Key: "k", Count: 3})
	require.NoError(t, err)
	got, err = recvAll(st)
	require.Empty(t, got)
	require.Equal(t, status.KindCommitted, status.OutcomeOf(err).Kind, "%v", err)
	require.Equal(t, int64(1), c.Calls("Watch"))

	a, _ := interceptor.AttemptFromContext(actx)
	rec, err := store.Get(t.Context(), idempotency.Key{Tenant: a.Tenant, AttemptID: a.ID, Call: "feed", Method: recordedWatch})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
}

// rawOwner plays the owner with a plain gRPC client: it sends the tollgate
// header given (strict accounting, so that tollgate-spent always comes back)
// and returns the messages, the error and the trailer.
type rawOwner struct {
	conn   *grpc.ClientConn
	prefix string // the header's a, d and n fields
	units  int    // granted to each try (u), when positive
}

func newRawOwner(t *testing.T, conn *grpc.ClientConn) (rawOwner, interceptor.Attempt) {
	t.Helper()
	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	return rawOwner{conn: conn, prefix: "a=" + a.ID + ";d=" + itoa(a.Deadline.UnixMilli()) + ";n=t1"}, a
}

func (w rawOwner) ctx(ctx context.Context, call string, try int) context.Context {
	h := w.prefix + ";c=" + call + ";t=" + strconv.Itoa(try) + ";r=1"
	if w.units > 0 {
		h += ";u=" + strconv.Itoa(w.units)
	}
	return metadata.AppendToOutgoingContext(ctx, "tollgate", h)
}

func (w rawOwner) consume(ctx context.Context, call string, try int, r *testingv1.ConsumeRequest) ([]string, metadata.MD, error) {
	st, err := testingv1.NewTestServiceClient(w.conn).Consume(w.ctx(ctx, call, try), r)
	if err != nil {
		return nil, nil, err
	}
	got, err := recvConsumed(st)
	return got, st.Trailer(), err
}

// A refused begin of a server-streaming try (here a mismatch and a try in
// progress, both found once the request arrived) is answered with the
// trailer a refused begin always had — tollgate-spent 0, and pushback for a
// NOT_ADMITTED refusal — runs no handler, finishes no record, and gives its
// admission slot back.
func TestRefusedServerStreamBeginSetsItsTrailerAndFreesItsSlot(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 2}), admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	running := func() int {
		cs, ok := ctrl.Stats().Class("work")
		require.True(t, ok)
		require.Equal(t, cs.Running, cs.UsedSlots)
		return cs.Running
	}
	hold, release := make(chan struct{}), make(chan struct{})
	c := newConsumer()
	c.consume = func(r *testingv1.ConsumeRequest, st grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
		if r.GetKey() == "hold" {
			if err := st.Send(&testingv1.ConsumeResponse{Value: "held"}); err != nil {
				return err
			}
			close(hold)
			select {
			case <-release:
			case <-st.Context().Done(): // a failed test stops the server
				return st.Context().Err()
			}
		}
		return countingConsume(r, st)
	}
	store := memoryStore(t)
	end := startRecorded(t, c, store, []interceptor.ServerOption{interceptor.WithAdmission(ctrl)})
	w, a := newRawOwner(t, end.DialT(t))
	record := func(call string) *tollgatev1.AttemptRecord {
		rec, err := store.Get(t.Context(), idempotency.Key{Tenant: "t1", AttemptID: a.ID, Call: call, Method: consumeMethod})
		require.NoError(t, err)
		return rec
	}

	got, tr, err := w.consume(t.Context(), "feed", 1, &testingv1.ConsumeRequest{Key: "k", Count: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"0", "1"}, got)
	require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"))
	require.Zero(t, running())

	t.Run("mismatch", func(t *testing.T) {
		got, tr, err := w.consume(t.Context(), "feed", 2, &testingv1.ConsumeRequest{Key: "k", Count: 3})
		require.Empty(t, got)
		require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
		require.Equal(t, status.ReasonAttemptRequestMismatch, status.OutcomeOf(err).Reason)
		require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"))
		require.Empty(t, tr.Get("grpc-retry-pushback-ms"), "a mismatch is no NOT_ADMITTED refusal")
		require.Zero(t, running(), "the refused stream gave its slot back")
		require.Equal(t, int64(1), c.runs.Load())
		rec := record("feed")
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState(), "the refused try finished nothing")
		require.Equal(t, uint32(1), rec.GetTry())
	})

	t.Run("in progress", func(t *testing.T) {
		first := make(chan error, 1)
		go func() {
			got, _, err := w.consume(t.Context(), "held", 1, &testingv1.ConsumeRequest{Key: "hold", Count: 1})
			if err == nil && len(got) != 2 {
				err = errors.New("held stream: got " + strconv.Itoa(len(got)) + " messages")
			}
			first <- err
		}()
		<-hold
		got, tr, err := w.consume(t.Context(), "held", 2, &testingv1.ConsumeRequest{Key: "hold", Count: 1})
		require.Empty(t, got)
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
		require.Equal(t, status.ReasonAttemptInProgress, o.Reason)
		require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"))
		require.Len(t, tr.Get("grpc-retry-pushback-ms"), 1, "a NOT_ADMITTED refusal before any header carries pushback")
		require.Equal(t, 1, running(), "only the running stream holds a slot")
		require.Equal(t, int64(2), c.runs.Load(), "the refused try ran no handler")
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, record("held").GetState())

		close(release)
		require.NoError(t, <-first)
		require.Zero(t, running())
		rec := record("held")
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
		require.Equal(t, uint32(1), rec.GetTry(), "the running try finished its own record")
	})
}

// A server-streaming call whose request never comes (the client closed its
// side without sending one) never reached the method: no record is begun,
// so the store can still vouch that the call did not run, and a later try
// with the request runs.
func TestServerStreamWithoutItsRequestKeepsNoRecord(t *testing.T) {
	c := newConsumer()
	store := memoryStore(t)
	end := startRecorded(t, c, store, nil)
	conn := end.DialT(t)
	w, a := newRawOwner(t, conn)

	cs, err := conn.NewStream(w.ctx(t.Context(), "feed", 1), &testingv1.TestService_ServiceDesc.Streams[3], consumeMethod)
	require.NoError(t, err)
	require.NoError(t, cs.CloseSend())
	err = cs.RecvMsg(new(testingv1.ConsumeResponse))
	// grpc-go's cardinality violation. grpc-go sends this status itself when
	// the receive fails, so no tollgate-spent goes with it: a strict caller
	// holds its grant until it reconciles, and the store, holding no record,
	// fences the try then.
	require.Equal(t, codes.Internal, grpcstatus.Code(err), "%v", err)
	require.Zero(t, c.runs.Load())
	rec, err := store.Get(t.Context(), idempotency.Key{Tenant: "t1", AttemptID: a.ID, Call: "feed", Method: consumeMethod})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())

	got, _, err := w.consume(t.Context(), "feed", 2, &testingv1.ConsumeRequest{Count: 1})
	require.NoError(t, err)
	require.Equal(t, []string{"0"}, got)
	require.Equal(t, int64(1), c.runs.Load())
}

// A server-streaming call whose first receive fails in the interceptor —
// refused by a stream interceptor chained outside tollgate's (a validator),
// or cut off by its client before the request came — returns that error, as
// grpc-go's generated handler would, runs no handler and begins no record;
// where grpc-go has not already sent its own status, the answer carries the
// trailer of a try that spent nothing.
func TestServerStreamWhoseFirstReceiveFailsKeepsNoRecord(t *testing.T) {
	type server struct {
		c         *consumer
		conn      *grpc.ClientConn
		w         rawOwner
		receiving chan struct{} // the outer stream's RecvMsg was called
		done      chan error    // what tollgate's interceptor returned
		record    func(call string) tollgatev1.AttemptState
	}
	start := func(t *testing.T) *server {
		sv := &server{c: newConsumer(), receiving: make(chan struct{}, 1), done: make(chan error, 1)}
		outer := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			err := h(srv, &validating{ServerStream: ss, receiving: sv.receiving})
			sv.done <- err
			return err
		})
		store := memoryStore(t)
		end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, sv.c) },
			append([]grpc.ServerOption{outer}, serverOpts(interceptor.WithAttemptStore(store))...)...)
		sv.conn = end.DialT(t)
		var a interceptor.Attempt
		sv.w, a = newRawOwner(t, sv.conn)
		sv.record = func(call string) tollgatev1.AttemptState {
			rec, err := store.Get(t.Context(), idempotency.Key{Tenant: "t1", AttemptID: a.ID, Call: call, Method: consumeMethod})
			require.NoError(t, err)
			return rec.GetState()
		}
		return sv
	}

	t.Run("refused by an outer interceptor", func(t *testing.T) {
		sv := start(t)
		got, tr, err := sv.w.consume(t.Context(), "feed", 1, &testingv1.ConsumeRequest{Count: 1})
		require.Empty(t, got)
		require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
		require.Equal(t, "validator: key required", grpcstatus.Convert(err).Message(), "the receive's own error")
		require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"))
		require.Equal(t, codes.InvalidArgument, grpcstatus.Code(<-sv.done))
		require.Zero(t, sv.c.runs.Load())
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, sv.record("feed"))
	})

	t.Run("client gone before its request", func(t *testing.T) {
		sv := start(t)
		ctx, cancel := context.WithCancel(sv.w.ctx(t.Context(), "feed", 1))
		defer cancel()
		cs, err := sv.conn.NewStream(ctx, &testingv1.TestService_ServiceDesc.Streams[3], consumeMethod)
		require.NoError(t, err)
		<-sv.receiving
		cancel()
		require.Equal(t, codes.Canceled, grpcstatus.Code(cs.RecvMsg(new(testingv1.ConsumeResponse))))
		require.Equal(t, codes.Canceled, grpcstatus.Code(<-sv.done))
		require.Zero(t, sv.c.runs.Load())
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, sv.record("feed"))

		got, _, err := sv.w.consume(t.Context(), "feed", 2, &testingv1.ConsumeRequest{Key: "k", Count: 1})
		require.NoError(t, err)
		require.Equal(t, []string{"0"}, got)
		require.NoError(t, <-sv.done)
		require.Equal(t, int64(1), sv.c.runs.Load())
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, sv.record("feed"))
	})
}

// validating is a stream interceptor's stream that refuses a ConsumeRequest
// without a key when it is received, and reports each receive.
type validating struct {
	grpc.ServerStream
	receiving chan<- struct{}
}

func (v *validating) RecvMsg(m any) error {
	select {
	case v.receiving <- struct{}{}:
	default:
	}
	if err := v.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if r, ok := m.(*testingv1.ConsumeRequest); ok && r.GetKey() == "" {
		return grpcstatus.Error(codes.InvalidArgument, "validator: key required")
	}
	return nil
}

// A hand-written server-streaming handler needs no rule of its own: its try
// is begun before it runs, whether tollgate received its request first (the
// registry knows the method) or not, so it may send before it receives, or
// never receive, or send from one goroutine while another receives, and its
// record is finished as any other. Where tollgate
// received the request, the handler's first RecvMsg gets a copy of it (into
// a message of the request's type, reset first), a second one io.EOF, as from
// grpc-go; a message of another type gets INTERNAL (its server passes
// WithoutStreamRequestFirst), and the try ends UNKNOWN.
func TestHandWrittenServerStreamRunsUnderItsRecord(t *testing.T) {
	type handler func(ss grpc.ServerStream) error
	receive := func(ss grpc.ServerStream, m *testingv1.ConsumeRequest) error {
		if err := ss.RecvMsg(m); err != nil {
			return err
		}
		if err := ss.SendMsg(&testingv1.ConsumeResponse{Value: m.GetKey() + "/" + strconv.Itoa(int(m.GetCount()))}); err != nil {
			return err
		}
		if err := ss.RecvMsg(new(testingv1.ConsumeRequest)); err != io.EOF {
			return grpcstatus.Errorf(codes.DataLoss, "second receive: %v", err)
		}
		return nil
	}
	cases := []struct {
		name   string
		h      handler
		known  bool // only where tollgate receives the request
		want   []string
		code   codes.Code
		record tollgatev1.AttemptState
	}{
		{"sends before receiving", func(ss grpc.ServerStream) error {
			if err := ss.SendMsg(&testingv1.ConsumeResponse{Value: "early"}); err != nil {
				return err
			}
			return receive(ss, new(testingv1.ConsumeRequest))
		}, false, []string{"early", "k/0"}, codes.OK, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED},
		{"sends while it receives", func(ss grpc.ServerStream) error {
			sent := make(chan error, 1)
			go func() { sent <- ss.SendMsg(&testingv1.ConsumeResponse{Value: "early"}) }()
			m := new(testingv1.ConsumeRequest)
			err := ss.RecvMsg(m)
			if serr := <-sent; serr != nil {
				return serr
			}
			if err != nil {
				return err
			}
			return ss.SendMsg(&testingv1.ConsumeResponse{Value: m.GetKey() + "/" + strconv.Itoa(int(m.GetCount()))})
		}, false, []string{"early", "k/0"}, codes.OK, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED},
		{"returns without receiving", func(ss grpc.ServerStream) error {
			return ss.SendMsg(&testingv1.ConsumeResponse{Value: "early"})
		}, false, []string{"early"}, codes.OK, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED},
		{"receives into a used message", func(ss grpc.ServerStream) error {
			return receive(ss, &testingv1.ConsumeRequest{Key: "stale", Count: 9})
		}, false, []string{"k/0"}, codes.OK, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED},
		{"receives another type", func(ss grpc.ServerStream) error {
			return ss.RecvMsg(new(testingv1.WatchRequest))
		}, true, nil, codes.Internal, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN},
	}
	for _, path := range []struct {
		name    string
		service string // the registry knows TestService's Consume, not HandWritten's
		known   bool
	}{
		{"request type known", "tollgate.testing.v1.TestService", true},
		{"request type unknown", "tollgate.testing.v1.HandWritten", false},
	} {
		method := "/" + path.service + "/Consume"
		for _, tc := range cases {
			if tc.known && !path.known {
				continue
			}
			t.Run(path.name+"/"+tc.name, func(t *testing.T) {
				var runs atomic.Int64
				store := memoryStore(t)
				desc := &grpc.ServiceDesc{
					ServiceName: path.service,
					HandlerType: (*any)(nil),
					Streams: []grpc.StreamDesc{{StreamName: "Consume", ServerStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
						runs.Add(1)
						return tc.h(ss)
					}}},
				}
				end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { s.RegisterService(desc, struct{}{}) },
					serverOpts(interceptor.WithAttemptStore(store))...)
				conn := end.DialT(t)
				w, a := newRawOwner(t, conn)
				cs, err := conn.NewStream(w.ctx(t.Context(), "feed", 1), &desc.Streams[0], method)
				require.NoError(t, err)
				require.NoError(t, cs.SendMsg(&testingv1.ConsumeRequest{Key: "k"}))
				require.NoError(t, cs.CloseSend())
				var got []string
				for {
					m := new(testingv1.ConsumeResponse)
					if err = cs.RecvMsg(m); err != nil {
						break
					}
					got = append(got, m.GetValue())
				}
				require.Equal(t, int64(1), runs.Load())
				require.Equal(t, tc.want, got)
				if tc.code == codes.OK {
					require.ErrorIs(t, err, io.EOF)
				} else {
					require.Equal(t, tc.code, grpcstatus.Code(err), "%v", err)
					require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
					require.Contains(t, err.Error(), "tollgate.testing.v1.ConsumeRequest")
				}
				require.Equal(t, []string{"0"}, cs.Trailer().Get("tollgate-spent"))
				rec, err := store.Get(t.Context(), idempotency.Key{Tenant: "t1", AttemptID: a.ID, Call: "feed", Method: method})
				require.NoError(t, err)
				require.Equal(t, tc.record, rec.GetState())
			})
		}
	}
}

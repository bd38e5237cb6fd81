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

// recordedService is TestService registered under a service name the
// protobuf registry does not know: its methods keep records (level
// IDEMPOTENCY_UNKNOWN, where the registry's Watch is NO_SIDE_EFFECTS), and
// its Watch still runs grpc-go's generated server-streaming handler, which
// receives the request and then calls the method.
const (
	recordedService = "tollgate.testing.v1.RecordedTestService"
	recordedWatch   = "/" + recordedService + "/Watch"
)

// startRecorded serves svc as recordedService with the store and its
// AttemptService, behind the test tier's server options and extra.
func startRecorded(t *testing.T, svc *testsvc.Service, store idempotency.Store, extra ...interceptor.ServerOption) *testsvc.Endpoint {
	t.Helper()
	desc := testingv1.TestService_ServiceDesc
	desc.ServiceName = recordedService
	return testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		s.RegisterService(&desc, svc)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(append([]interceptor.ServerOption{interceptor.WithAttemptStore(store)}, extra...)...)...)
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

// countingWatch sends the count of messages asked for, or fails NOT_FOUND
// for the key "missing".
func countingWatch(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
	if r.GetKey() == "missing" {
		return grpcstatus.Error(codes.NotFound, "no such key")
	}
	return sendWatch(st, r.GetCount())
}

// An explicitly keyed server-streaming call re-run with another request is
// refused as a mismatch (DESIGN.md §2.2), whatever the record holds, and the
// handler does not run for it.
func TestExplicitKeyServerStreamWithAnotherRequestIsAMismatch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		first    *testingv1.WatchRequest
		firstErr codes.Code
		existing tollgatev1.Outcome
	}{
		{"succeeded", &testingv1.WatchRequest{Key: "k", Count: 2}, codes.OK, tollgatev1.Outcome_OUTCOME_COMMITTED},
		{"failed", &testingv1.WatchRequest{Key: "missing"}, codes.NotFound, tollgatev1.Outcome_OUTCOME_UNKNOWN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &testsvc.Service{WatchFunc: countingWatch}
			end := startRecorded(t, svc, memoryStore(t))
			conn := end.DialT(t, interceptor.DialOptions(fastRetry(3))...)
			actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)
			ctx := interceptor.WithCallKey(actx, "feed")

			st, err := watchRecorded(ctx, conn, tc.first)
			require.NoError(t, err)
			_, err = recvAll(st)
			require.Equal(t, tc.firstErr, grpcstatus.Code(err), "%v", err)
			require.Equal(t, int64(1), svc.Calls("Watch"))

			st, err = watchRecorded(ctx, conn, &testingv1.WatchRequest{Key: "k", Count: 3})
			require.NoError(t, err)
			got, err := recvAll(st)
			require.Empty(t, got, "no message of the other request's run")
			require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
			o := status.OutcomeOf(err)
			require.Equal(t, status.ReasonAttemptRequestMismatch, o.Reason, "%v", err)
			require.True(t, o.Final())
			require.Equal(t, tc.existing, o.Detail.GetOutcome(), "the mismatch says what the record holds")
			require.Equal(t, int64(1), svc.Calls("Watch"), "the handler did not run for the other request")
		})
	}
}

// The same request re-run under the same explicit key is still answered from
// the record, without running the handler: COMMITTED for a stream that
// succeeded, the definite error for one that failed.
func TestExplicitKeyServerStreamWithTheSameRequestIsAnsweredFromItsRecord(t *testing.T) {
	for _, tc := range []struct {
		name    string
		req     *testingv1.WatchRequest
		want    []string
		wantErr func(t *testing.T, err error)
	}{
		{"succeeded", &testingv1.WatchRequest{Key: "k", Count: 2}, []string{"0", "1"}, func(t *testing.T, err error) {
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindCommitted, o.Kind, "%v", err)
			require.Equal(t, codes.FailedPrecondition, grpcstatus.Code(err))
		}},
		{"failed", &testingv1.WatchRequest{Key: "missing"}, nil, func(t *testing.T, err error) {
			require.Equal(t, codes.NotFound, grpcstatus.Code(err), "%v", err)
			require.Equal(t, "no such key", grpcstatus.Convert(err).Message())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &testsvc.Service{WatchFunc: countingWatch}
			end := startRecorded(t, svc, memoryStore(t))
			conn := end.DialT(t, interceptor.DialOptions(fastRetry(3))...)
			actx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)
			ctx := interceptor.WithCallKey(actx, "feed")

			st, err := watchRecorded(ctx, conn, tc.req)
			require.NoError(t, err)
			got, err := recvAll(st)
			require.Equal(t, tc.want, got)
			if tc.want != nil {
				require.NoError(t, err)
			}

			st, err = watchRecorded(ctx, conn, tc.req)
			require.NoError(t, err)
			got, err = recvAll(st)
			require.Empty(t, got)
			tc.wantErr(t, err)
			require.Equal(t, int64(1), svc.Calls("Watch"), "the record answered the re-run")
		})
	}
}

// rawWatch is a Watch of recordedService by a plain gRPC client playing the
// owner: it sends the tollgate header given (strict accounting, so that
// tollgate-spent always comes back) and returns the messages, the error and
// the trailer.
type rawWatch struct {
	conn   *grpc.ClientConn
	prefix string // the header's a, d and n fields
}

func (w rawWatch) run(ctx context.Context, call string, try int, r *testingv1.WatchRequest) ([]string, metadata.MD, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", w.prefix+";c="+call+";t="+strconv.Itoa(try)+";r=1")
	st, err := watchRecorded(ctx, w.conn, r)
	if err != nil {
		return nil, nil, err
	}
	got, err := recvAll(st)
	return got, st.Trailer(), err
}

func newRawWatch(t *testing.T, conn *grpc.ClientConn) (rawWatch, interceptor.Attempt) {
	t.Helper()
	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	return rawWatch{conn: conn, prefix: "a=" + a.ID + ";d=" + itoa(a.Deadline.UnixMilli()) + ";n=t1"}, a
}

// A refused begin of a server-streaming try (here a mismatch and a try in
// progress, both found when the request arrives) is answered with the
// trailer a refused begin always had — tollgate-spent 0, and pushback for a
// NOT_ADMITTED refusal — finishes no record, and gives its admission slot
// back.
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
	svc := &testsvc.Service{WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		if r.GetKey() == "hold" {
			if err := sendWatch(st, 1); err != nil {
				return err
			}
			close(hold)
			select {
			case <-release:
			case <-st.Context().Done(): // a failed test stops the server
				return st.Context().Err()
			}
		}
		return countingWatch(r, st)
	}}
	store := memoryStore(t)
	end := startRecorded(t, svc, store, interceptor.WithAdmission(ctrl))
	w, a := newRawWatch(t, end.DialT(t))
	record := func(call string) *tollgatev1.AttemptRecord {
		rec, err := store.Get(t.Context(), idempotency.Key{Tenant: "t1", AttemptID: a.ID, Call: call, Method: recordedWatch})
		require.NoError(t, err)
		return rec
	}

	got, tr, err := w.run(t.Context(), "feed", 1, &testingv1.WatchRequest{Key: "k", Count: 2})
	require.NoError(t, err)
	require.Equal(t, []string{"0", "1"}, got)
	require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"))
	require.Zero(t, running())

	t.Run("mismatch", func(t *testing.T) {
		got, tr, err := w.run(t.Context(), "feed", 2, &testingv1.WatchRequest{Key: "k", Count: 3})
		require.Empty(t, got)
		require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
		require.Equal(t, status.ReasonAttemptRequestMismatch, status.OutcomeOf(err).Reason)
		require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"))
		require.Empty(t, tr.Get("grpc-retry-pushback-ms"), "a mismatch is no NOT_ADMITTED refusal")
		require.Zero(t, running(), "the refused stream gave its slot back")
		require.Equal(t, int64(1), svc.Calls("Watch"))
		rec := record("feed")
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState(), "the refused try finished nothing")
		require.Equal(t, uint32(1), rec.GetTry())
	})

	t.Run("in progress", func(t *testing.T) {
		first := make(chan error, 1)
		go func() {
			got, _, err := w.run(t.Context(), "held", 1, &testingv1.WatchRequest{Key: "hold", Count: 1})
			if err == nil && len(got) != 2 {
				err = errors.New("held stream: got " + strconv.Itoa(len(got)) + " messages")
			}
			first <- err
		}()
		<-hold
		got, tr, err := w.run(t.Context(), "held", 2, &testingv1.WatchRequest{Key: "hold", Count: 1})
		require.Empty(t, got)
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
		require.Equal(t, status.ReasonAttemptInProgress, o.Reason)
		require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"))
		require.Len(t, tr.Get("grpc-retry-pushback-ms"), 1, "a NOT_ADMITTED refusal before any header carries pushback")
		require.Equal(t, 1, running(), "only the running stream holds a slot")
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
	svc := &testsvc.Service{WatchFunc: countingWatch}
	store := memoryStore(t)
	end := startRecorded(t, svc, store)
	conn := end.DialT(t)
	w, a := newRawWatch(t, conn)

	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", w.prefix+";c=feed;t=1")
	cs, err := conn.NewStream(ctx, &testingv1.TestService_ServiceDesc.Streams[0], recordedWatch)
	require.NoError(t, err)
	require.NoError(t, cs.CloseSend())
	err = cs.RecvMsg(new(testingv1.WatchResponse))
	require.Equal(t, codes.Internal, grpcstatus.Code(err), "%v", err) // grpc-go's cardinality violation
	require.Zero(t, svc.Calls("Watch"))
	rec, err := store.Get(t.Context(), idempotency.Key{Tenant: "t1", AttemptID: a.ID, Call: "feed", Method: recordedWatch})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())

	got, _, err := w.run(t.Context(), "feed", 2, &testingv1.WatchRequest{Count: 1})
	require.NoError(t, err)
	require.Equal(t, []string{"0"}, got)
	require.Equal(t, int64(1), svc.Calls("Watch"))
}

// handWritten serves one server-streaming method, Feed, with a hand-written
// handler (no generated code receives the request for it).
const handWrittenFeed = "/tollgate.testing.v1.HandWritten/Feed"

func startHandWritten(t *testing.T, store idempotency.Store, h grpc.StreamHandler) *testsvc.Endpoint {
	t.Helper()
	desc := &grpc.ServiceDesc{
		ServiceName: "tollgate.testing.v1.HandWritten",
		HandlerType: (*any)(nil),
		Streams:     []grpc.StreamDesc{{StreamName: "Feed", Handler: h, ServerStreams: true}},
	}
	return testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { s.RegisterService(desc, struct{}{}) },
		serverOpts(interceptor.WithAttemptStore(store))...)
}

// A hand-written server-streaming handler that sends before it received its
// request, or returns without receiving it, ran before its record could be
// begun: its message is not sent, the try ends UNKNOWN (final: no query or
// repeat can tell what it did), and the store keeps that UNKNOWN, so that a
// lost answer cannot be resolved as "never ran". A handler that receives
// first keeps its record as a generated one does.
func TestHandWrittenServerStreamMustReceiveBeforeItActs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(ss grpc.ServerStream) error
		ok      bool
	}{
		{"returns without receiving", func(ss grpc.ServerStream) error { return nil }, false},
		{"sends before receiving", func(ss grpc.ServerStream) error {
			if err := ss.SendMsg(&testingv1.WatchResponse{Value: "early"}); err != nil {
				return err
			}
			r := new(testingv1.WatchRequest)
			if err := ss.RecvMsg(r); err != nil {
				return err
			}
			return ss.SendMsg(&testingv1.WatchResponse{Value: r.GetKey()})
		}, false},
		{"ignores the refused send", func(ss grpc.ServerStream) error {
			_ = ss.SendMsg(&testingv1.WatchResponse{Value: "early"})
			r := new(testingv1.WatchRequest)
			if err := ss.RecvMsg(r); err != nil {
				return err
			}
			return ss.SendMsg(&testingv1.WatchResponse{Value: r.GetKey()})
		}, false},
		{"receives first", func(ss grpc.ServerStream) error {
			r := new(testingv1.WatchRequest)
			if err := ss.RecvMsg(r); err != nil {
				return err
			}
			return ss.SendMsg(&testingv1.WatchResponse{Value: r.GetKey()})
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			store := memoryStore(t)
			end := startHandWritten(t, store, func(_ any, ss grpc.ServerStream) error {
				runs.Add(1)
				return tc.handler(ss)
			})
			conn := end.DialT(t)
			_, a := newRawWatch(t, conn)
			ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
				"a="+a.ID+";c=feed;t=1;d="+itoa(a.Deadline.UnixMilli())+";n=t1")
			cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, handWrittenFeed)
			require.NoError(t, err)
			require.NoError(t, cs.SendMsg(&testingv1.WatchRequest{Key: "k"}))
			require.NoError(t, cs.CloseSend())
			var got []string
			for {
				m := new(testingv1.WatchResponse)
				if err = cs.RecvMsg(m); err != nil {
					break
				}
				got = append(got, m.GetValue())
			}
			require.Equal(t, int64(1), runs.Load())
			rec, gerr := store.Get(t.Context(), idempotency.Key{Tenant: "t1", AttemptID: a.ID, Call: "feed", Method: handWrittenFeed})
			require.NoError(t, gerr)
			if tc.ok {
				require.ErrorIs(t, err, io.EOF)
				require.Equal(t, []string{"k"}, got)
				require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
				return
			}
			require.Empty(t, got, "nothing is sent before the record is begun")
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
			require.True(t, o.Final(), "%v", err)
			require.Equal(t, codes.Internal, grpcstatus.Code(err))
			require.Equal(t, a.ID, o.Detail.GetAttemptId())
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "the store does not read the run as absent")
		})
	}
}

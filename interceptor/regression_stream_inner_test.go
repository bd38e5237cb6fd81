package interceptor_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Regression: an interceptor chained inside tollgate's (grpc.NewServer(
// interceptor.ServerOptions(...)..., grpc.ChainStreamInterceptor(audit)))
// runs only for a try whose record the store started, for a server-streaming
// call as for a unary one. When a server-streaming record was begun lazily,
// at the handler's first RecvMsg, such an interceptor's effect (here a
// downstream call with side effects) happened for a try the store then
// refused: the try was answered NOT_ADMITTED ATTEMPT_FENCED — "no effect at
// this tier or below" (DESIGN.md §3.6) — with tollgate-spent 1, and the
// effect repeated on the owner's next try.
//
// Each kind of call is sent as try 1 of a call the owner fenced through try
// 1, which the store refuses before anything inner runs, and then as try 2,
// which runs: the inner interceptor acts once, for try 2, and for a
// server-streaming call whose request tollgate received first it sees that
// request.
func TestRegressionInnerStreamInterceptorRunsOnlyForABegunTry(t *testing.T) {
	dep := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions()...))
	audit := func(ctx context.Context) error {
		_, err := depClient.Apply(ctx, &testingv1.ApplyRequest{})
		return err
	}
	var (
		mu       sync.Mutex
		received []string // request keys the inner stream interceptor saw
	)
	inner := []grpc.ServerOption{
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := audit(ss.Context()); err != nil {
				return err
			}
			return h(srv, &observed{ServerStream: ss, seen: func(key string) {
				mu.Lock()
				received = append(received, key)
				mu.Unlock()
			}})
		}),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := audit(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
	}
	c := newConsumer()
	c.ApplyFunc = func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}
	store := memoryStore(t)
	end := startRecorded(t, c, store, nil, inner...)
	conn := end.DialT(t)
	w, a := newRawOwner(t, conn)
	w.units = 2

	for i, tc := range []struct {
		name   string
		method string
		call   func(ctx context.Context) (metadata.MD, error)
		runs   func() int64
		seen   []string // what the inner stream interceptor received
	}{
		{"unary", testingv1.TestService_Apply_FullMethodName, func(ctx context.Context) (metadata.MD, error) {
			var tr metadata.MD
			err := conn.Invoke(ctx, testingv1.TestService_Apply_FullMethodName, &testingv1.ApplyRequest{}, &testingv1.ApplyResponse{}, grpc.Trailer(&tr))
			return tr, err
		}, func() int64 { return c.Calls("Apply") }, nil},
		{"server stream, request received first", consumeMethod, func(ctx context.Context) (metadata.MD, error) {
			st, err := testingv1.NewTestServiceClient(conn).Consume(ctx, &testingv1.ConsumeRequest{Key: "consumed", Count: 1})
			if err != nil {
				return nil, err
			}
			_, err = recvConsumed(st)
			return st.Trailer(), err
		}, c.runs.Load, []string{"consumed"}},
		{"server stream, request type unknown", recordedWatch, func(ctx context.Context) (metadata.MD, error) {
			st, err := watchRecorded(ctx, conn, &testingv1.WatchRequest{Key: "watched", Count: 1})
			if err != nil {
				return nil, err
			}
			_, err = recvAll(st)
			return st.Trailer(), err
		}, func() int64 { return c.Calls("Watch") }, []string{"watched"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			received = nil
			mu.Unlock()
			call := "audited-" + strconv.Itoa(i)
			key := idempotency.Key{Tenant: "t1", AttemptID: a.ID, Call: call, Method: tc.method}
			_, err := store.Fence(t.Context(), key, 1)
			require.NoError(t, err)
			audits, runs := dep.Calls("Apply"), tc.runs()

			tr, err := tc.call(w.ctx(t.Context(), call, 1))
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.Equal(t, status.ReasonAttemptFenced, o.Reason, "%v", err)
			require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"), "the refused try spent nothing")
			require.Equal(t, audits, dep.Calls("Apply"), "the inner interceptor acted for a try answered NOT_ADMITTED")
			require.Equal(t, runs, tc.runs())

			tr, err = tc.call(w.ctx(t.Context(), call, 2))
			require.NoError(t, err)
			require.Equal(t, []string{"1"}, tr.Get("tollgate-spent"), "the inner interceptor's call is this try's")
			require.Equal(t, audits+1, dep.Calls("Apply"), "the inner interceptor acts for the try that runs")
			require.Equal(t, runs+1, tc.runs())
			mu.Lock()
			require.Equal(t, tc.seen, received)
			mu.Unlock()
			rec, err := store.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
			require.Equal(t, uint32(2), rec.GetTry())
		})
	}
}

// observed is a stream interceptor's stream that reports the key of each
// request its handler receives.
type observed struct {
	grpc.ServerStream
	seen func(key string)
}

func (o *observed) RecvMsg(m any) error {
	if err := o.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if r, ok := m.(interface{ GetKey() string }); ok {
		o.seen(r.GetKey())
	}
	return nil
}

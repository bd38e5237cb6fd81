package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The example runs in-process on loopback; the record it printed the
// command for is read over real TCP, as grpcurl would, and reflection lists
// the service.
func TestAttemptServerAnswersItsCommand(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		out := &syncBuffer{}
		ready := make(chan info, 1)
		done := make(chan error, 1)
		args := []string{"-addr", "127.0.0.1:0"}
		if asJSON {
			args = append(args, "-json")
		}
		go func() { done <- run(ctx, args, out, &syncBuffer{}, ready) }()
		var in info
		select {
		case in = <-ready:
		case err := <-done:
			cancel()
			t.Fatal(err)
		}
		if asJSON {
			var printed info
			require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out.String())), &printed))
			require.Equal(t, in, printed)
		} else {
			require.Contains(t, out.String(), in.Command)
		}
		require.Equal(t, `grpcurl -plaintext -d '{"attempt_id":"`+in.AttemptID+`","call":"0","method":"/example.v1.Orders/PlaceOrder"}' `+in.Addr+` tollgate.v1.AttemptService/GetAttempt`, in.Command)

		conn, err := grpc.NewClient(in.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		rec, err := tollgatev1.NewAttemptServiceClient(conn).GetAttempt(ctx, &tollgatev1.GetAttemptRequest{AttemptId: in.AttemptID, Call: "0", Method: method})
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
		var resp wrapperspb.StringValue
		require.NoError(t, proto.Unmarshal(rec.GetResponse(), &resp))
		require.Equal(t, "order 42 placed", resp.GetValue())

		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		require.NoError(t, err)
		require.NoError(t, stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
		r, err := stream.Recv()
		require.NoError(t, err)
		var names []string
		for _, s := range r.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		require.Contains(t, names, "tollgate.v1.AttemptService")
		require.NoError(t, stream.CloseSend())
		require.NoError(t, conn.Close())

		cancel()
		require.NoError(t, <-done)
	}
}

func TestAttemptServerStopsAfterDuration(t *testing.T) {
	err := run(context.Background(), []string{"-addr", "127.0.0.1:0", "-duration", "1ms"}, &syncBuffer{}, &syncBuffer{}, nil)
	require.NoError(t, err)
}

// TestAttemptServerCommandLineMistakes: a stray argument and an unknown
// flag exit 2, as in the other examples, and the error is printed once. A
// review found a stray argument exiting 1 and -bogus printing its error
// twice (by the flag set, then again by main).
func TestAttemptServerCommandLineMistakes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-addr", "127.0.0.1:0", "stray"}, `unexpected arguments ["stray"]`},
		{[]string{"-bogus"}, "flag provided but not defined: -bogus"},
	} {
		stderr := &syncBuffer{}
		err := run(context.Background(), tc.args, &syncBuffer{}, stderr, nil)
		require.Error(t, err)
		require.Equal(t, 2, exitStatus(err, stderr), "%v", tc.args)
		require.Equal(t, 1, strings.Count(stderr.String(), tc.want), "printed once: %q", stderr.String())
	}
	stderr := &syncBuffer{}
	err := run(context.Background(), []string{"-h"}, &syncBuffer{}, stderr, nil)
	require.Zero(t, exitStatus(err, stderr))
	require.Contains(t, stderr.String(), "-duration")
	err = run(context.Background(), []string{"-duration", "-1s"}, &syncBuffer{}, stderr, nil)
	require.Equal(t, 1, exitStatus(err, stderr), "a bad value is an error of the run, as in the other examples")
}

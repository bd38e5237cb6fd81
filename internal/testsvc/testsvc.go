// Package testsvc runs real gRPC servers for tollgate's tests and examples:
// over bufconn for unit tests, over loopback TCP for integration tests and
// examples, with the server and client options under test. Its Service
// implements the test proto with per-method handler functions and counters.
package testsvc

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// Transport names how an Endpoint is reached.
type Transport int

const (
	// Bufconn is an in-memory connection: no ports, no network.
	Bufconn Transport = iota
	// TCP is a real loopback TCP listener on 127.0.0.1:0.
	TCP
)

// Endpoint is one running gRPC server.
type Endpoint struct {
	Server *grpc.Server
	Addr   string
	lis    net.Listener
	buf    *bufconn.Listener
	done   chan struct{}
}

// Start runs a gRPC server built with opts, on which register registers its
// services, until Stop. It is the caller's to stop.
func Start(tr Transport, register func(*grpc.Server), opts ...grpc.ServerOption) (*Endpoint, error) {
	e := &Endpoint{Server: grpc.NewServer(opts...), done: make(chan struct{})}
	register(e.Server)
	switch tr {
	case TCP:
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		e.lis, e.Addr = lis, lis.Addr().String()
	default:
		e.buf = bufconn.Listen(1 << 20)
		e.lis, e.Addr = e.buf, "passthrough:///bufconn"
	}
	go func() {
		defer close(e.done)
		_ = e.Server.Serve(e.lis)
	}()
	return e, nil
}

// StartT is Start for a test: it fails the test on error and stops the
// server when the test ends.
func StartT(tb testing.TB, tr Transport, register func(*grpc.Server), opts ...grpc.ServerOption) *Endpoint {
	tb.Helper()
	e, err := Start(tr, register, opts...)
	if err != nil {
		tb.Fatalf("testsvc: start: %v", err)
	}
	tb.Cleanup(e.Stop)
	return e
}

// Stop stops the server at once and waits for its serving goroutine.
func (e *Endpoint) Stop() {
	e.Server.Stop()
	<-e.done
}

// Dial returns a client connection to the endpoint with opts (insecure
// transport credentials are added).
func (e *Endpoint) Dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	if e.buf != nil {
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return e.buf.DialContext(ctx)
		}))
	}
	return grpc.NewClient(e.Addr, opts...)
}

// DialT is Dial for a test: it fails the test on error and closes the
// connection when the test ends.
func (e *Endpoint) DialT(tb testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	conn, err := e.Dial(opts...)
	if err != nil {
		tb.Fatalf("testsvc: dial: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Service implements testingv1.TestServiceServer with one function per
// method; a nil function answers UNIMPLEMENTED. Calls counts the calls that
// reached each method's handler. Set the functions before serving.
type Service struct {
	testingv1.UnimplementedTestServiceServer

	GetFunc    func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error)
	PutFunc    func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error)
	ApplyFunc  func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error)
	WatchFunc  func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error
	UploadFunc func(grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error
	ChatFunc   func(grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error
	LookupFunc func(grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error

	mu    sync.Mutex
	calls map[string]*atomic.Int64
}

// Register registers the service on srv.
func (s *Service) Register(srv *grpc.Server) { testingv1.RegisterTestServiceServer(srv, s) }

func (s *Service) count(method string) {
	s.mu.Lock()
	if s.calls == nil {
		s.calls = map[string]*atomic.Int64{}
	}
	c := s.calls[method]
	if c == nil {
		c = new(atomic.Int64)
		s.calls[method] = c
	}
	s.mu.Unlock()
	c.Add(1)
}

// Calls returns how many calls reached method's handler ("Get", "Put", …).
func (s *Service) Calls(method string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.calls[method]; c != nil {
		return c.Load()
	}
	return 0
}

var errUnimplemented = grpcstatus.Error(codes.Unimplemented, "testsvc: no handler")

// Get implements testingv1.TestServiceServer.
func (s *Service) Get(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
	s.count("Get")
	if s.GetFunc == nil {
		return nil, errUnimplemented
	}
	return s.GetFunc(ctx, r)
}

// Put implements testingv1.TestServiceServer.
func (s *Service) Put(ctx context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
	s.count("Put")
	if s.PutFunc == nil {
		return nil, errUnimplemented
	}
	return s.PutFunc(ctx, r)
}

// Apply implements testingv1.TestServiceServer.
func (s *Service) Apply(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
	s.count("Apply")
	if s.ApplyFunc == nil {
		return nil, errUnimplemented
	}
	return s.ApplyFunc(ctx, r)
}

// Watch implements testingv1.TestServiceServer.
func (s *Service) Watch(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
	s.count("Watch")
	if s.WatchFunc == nil {
		return errUnimplemented
	}
	return s.WatchFunc(r, st)
}

// Upload implements testingv1.TestServiceServer.
func (s *Service) Upload(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
	s.count("Upload")
	if s.UploadFunc == nil {
		return errUnimplemented
	}
	return s.UploadFunc(st)
}

// Chat implements testingv1.TestServiceServer.
func (s *Service) Chat(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
	s.count("Chat")
	if s.ChatFunc == nil {
		return errUnimplemented
	}
	return s.ChatFunc(st)
}

// Lookup implements testingv1.TestServiceServer.
func (s *Service) Lookup(st grpc.BidiStreamingServer[testingv1.LookupRequest, testingv1.LookupResponse]) error {
	s.count("Lookup")
	if s.LookupFunc == nil {
		return errUnimplemented
	}
	return s.LookupFunc(st)
}

// DrainUpload reads an upload stream to its end and returns the count of
// messages received.
func DrainUpload(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) (int32, error) {
	var n int32
	for {
		_, err := st.Recv()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n++
	}
}

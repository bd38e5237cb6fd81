// Command attemptserver serves tollgate's AttemptService from a memory store,
// with gRPC reflection, on loopback. On start it runs one recorded call into
// the store — try 1 of call "0" of a new attempt to /example.v1.Orders/PlaceOrder,
// which succeeds — and prints the grpcurl command that reads its record:
//
//	go run ./examples/attemptserver -duration 1m
//	grpcurl -plaintext -d '{"attempt_id":"…","call":"0","method":"/example.v1.Orders/PlaceOrder"}' \
//	    127.0.0.1:50051 tollgate.v1.AttemptService/GetAttempt
//
// Callers on loopback all belong to one tenant, "local"; any other caller is
// tenant "remote" and sees none of local's records. The server stops after
// -duration (0: when interrupted).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	if code := exitStatus(err, os.Stderr); code != 0 {
		os.Exit(code)
	}
}

// usageError is a mistake on the command line. It exits 2, as the other
// examples' (and the flag package's) command-line errors do.
type usageError struct {
	err     error
	printed bool // the flag set already printed it, with the usage
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitStatus is the process's exit status for run's error, which it prints
// to stderr unless the flag set already did: 0 for none (and for -h, whose
// usage the flag set printed), 2 for a command-line mistake, else 1.
func exitStatus(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		if !ue.printed {
			fmt.Fprintln(stderr, "attemptserver:", err)
		}
		return 2
	}
	fmt.Fprintln(stderr, "attemptserver:", err)
	return 1
}

// info is what the server tells once it is ready.
type info struct {
	Addr      string `json:"addr"`
	Tenant    string `json:"tenant"`
	AttemptID string `json:"attempt_id"`
	Call      string `json:"call"`
	Method    string `json:"method"`
	State     string `json:"state"`
	Command   string `json:"grpcurl"`
}

const method = "/example.v1.Orders/PlaceOrder"

// localTenant gives every loopback caller the tenant "local".
func localTenant(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		if a, ok := p.Addr.(*net.TCPAddr); ok && a.IP.IsLoopback() {
			return "local"
		}
	}
	return "remote"
}

// run serves until ctx ends or -duration passes; the flag set's errors and
// usage go to errOut.
func run(ctx context.Context, args []string, out, errOut io.Writer, ready chan<- info) error {
	fs := flag.NewFlagSet("attemptserver", flag.ContinueOnError)
	fs.SetOutput(errOut)
	addr := fs.String("addr", "127.0.0.1:50051", "address to listen on")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until interrupted)")
	asJSON := fs.Bool("json", false, "print what was set up as one JSON object")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err: err, printed: true}
	}
	if fs.NArg() > 0 {
		return &usageError{err: fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	if *duration < 0 {
		return fmt.Errorf("-duration %v: must not be negative (0: run until interrupted)", *duration)
	}
	policy := idempotency.DefaultPolicy()
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(policy))
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	tollgatev1.RegisterAttemptServiceServer(srv, idempotency.NewAttemptService(store, idempotency.WithTenant(localTenant)))
	reflection.Register(srv)

	// The store vouches only for attempts created at least the clock skew
	// after it began retaining (its horizon), so wait that long.
	if err := wait(ctx, policy.Skew); err != nil {
		_ = lis.Close()
		return err
	}
	in, err := recordOneCall(ctx, store, policy)
	if err != nil {
		_ = lis.Close()
		return err
	}
	in.Addr = lis.Addr().String()
	in.Command = fmt.Sprintf(`grpcurl -plaintext -d '{"attempt_id":%q,"call":%q,"method":%q}' %s tollgate.v1.AttemptService/GetAttempt`,
		in.AttemptID, in.Call, in.Method, in.Addr)
	if *asJSON {
		b, _ := json.Marshal(in)
		fmt.Fprintln(out, string(b))
	} else {
		fmt.Fprintf(out, "attemptserver: AttemptService and reflection on %s (memory store, single replica)\n", in.Addr)
		fmt.Fprintf(out, "recorded try 1 of call %q of attempt %s to %s: %s; loopback callers are tenant %q\n",
			in.Call, in.AttemptID, in.Method, in.State, in.Tenant)
		fmt.Fprintf(out, "read its record from this machine (a caller from elsewhere is another tenant and reads UNSEEN), %s, with:\n  %s\n",
			readableFor(policy.TTL, *duration), in.Command)
	}
	if ready != nil {
		ready <- in
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	var timeout <-chan time.Time
	if *duration > 0 {
		t := time.NewTimer(*duration)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ctx.Done():
	case <-timeout:
	case err := <-served:
		return err
	}
	srv.GracefulStop()
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// recordOneCall runs try 1 of call "0" of a new attempt through the store,
// as tollgate's server interceptor would around a handler that succeeds.
func recordOneCall(ctx context.Context, store idempotency.Store, policy idempotency.Policy) (info, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return info{}, err
	}
	req, _ := proto.Marshal(wrapperspb.String("order 42: 3 blue mugs"))
	resp, _ := proto.Marshal(wrapperspb.String("order 42 placed"))
	key := idempotency.Key{Tenant: "local", AttemptID: id.String(), Call: "0", Method: method}
	fp := idempotency.Fingerprint(method, req)
	res, err := store.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Fingerprint: fp, Deadline: time.Now().Add(10 * time.Second)})
	if err != nil {
		return info{}, err
	}
	if !res.Started {
		return info{}, fmt.Errorf("the recorded call did not start: %v", res.Refusal)
	}
	// The handler runs here; it succeeds with resp.
	if err := store.Finish(ctx, idempotency.FinishRequest{Key: key, Try: 1, Fingerprint: fp,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: resp}); err != nil {
		return info{}, err
	}
	rec, err := store.Get(ctx, key)
	if err != nil {
		return info{}, err
	}
	return info{Tenant: key.Tenant, AttemptID: key.AttemptID, Call: key.Call, Method: key.Method, State: rec.GetState().String()}, nil
}

// readableFor says how long the record can be read: the store's TTL, unless
// the server (whose memory store holds the only copy) stops sooner.
func readableFor(ttl, duration time.Duration) string {
	if duration > 0 && duration < ttl {
		return fmt.Sprintf("for %v, until the server stops (its memory store goes with it; the record's TTL is %v)", duration, ttl)
	}
	if duration == 0 {
		return fmt.Sprintf("within %v (the store's TTL), while the server runs", ttl)
	}
	return fmt.Sprintf("within %v (the store's TTL)", ttl)
}

func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Command quickstart is the README's quick start, whole and runnable: a
// server with tollgate's interceptors (trusted peers, tenants, admission
// control, attempt records) and a client with tollgate's dial options, on
// loopback in one process.
//
//	go run ./examples/quickstart
//
// The client places one order (starting a new attempt after a refusal that
// had no effect, such as the one a server gives the attempts its new store
// cannot vouch for), reads the record the server kept of it over the
// AttemptService, and then makes a call whose deadline cannot be met, to
// show how status.OutcomeOf reads a failure. The README's quick-start
// snippets are copied from this file, and a test keeps them the same.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	quickstartv1 "github.com/tollgate-go/tollgate/examples/quickstart/proto/quickstart/v1"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run serves on a loopback port of its own, runs the client against it, and
// stops the server.
func run(ctx context.Context, out io.Writer) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- serve(ctx, lis) }()
	err = client(context.WithoutCancel(ctx), lis.Addr().String(), out)
	stop()
	return errors.Join(err, <-served)
}

// serve is the quick start's server: it serves on lis until ctx ends, then
// stops gracefully.
func serve(ctx context.Context, lis net.Listener) error {
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica) // one replica ever; else redisstore.New
	if err != nil {
		return err
	}
	ctrl, err := admission.New(admission.WithClasses(
		admission.Class{Name: "default", Slots: 6, QueueItems: 12, // reserved slots, bounded queue
			ExpectedServiceTime: 50 * time.Millisecond}, // seeds waits and retry-afters until learned
	))
	if err != nil {
		return err
	}
	defer ctrl.Close() // idempotent; at shutdown, close it before srv.GracefulStop (below)
	srv := grpc.NewServer(interceptor.ServerOptions(
		interceptor.WithTrustedPeer(interceptor.TrustLoopback), // or TrustAll when only your own services can connect, or your own func(ctx) bool
		interceptor.WithTenant(tenantFromPeer),                 // your func(ctx) string: the caller's tenant, unless a trusted peer's header names one
		interceptor.WithAdmission(ctrl),                        // optional: admission control (and its tap)
		interceptor.WithAttemptStore(store),                    // optional: at most one run per call, answers for owners
	)...)
	tollgatev1.RegisterAttemptServiceServer(srv, idempotency.NewAttemptService(store))
	quickstartv1.RegisterOrderServiceServer(srv, orders{}) // your services

	go func() {
		<-ctx.Done()
		ctrl.Close()       // first: what still waits, and what arrives now, is refused DRAINING at once
		srv.GracefulStop() // then: what runs finishes (GracefulStop waits for queued calls too)
	}()
	return srv.Serve(lis)
}

// tenantFromPeer names the caller's tenant. A real server would read it
// from the caller's authenticated identity (its TLS certificate, a token);
// here every loopback caller is tenant "local", any other "remote".
func tenantFromPeer(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		if a, ok := p.Addr.(*net.TCPAddr); ok && a.IP.IsLoopback() {
			return "local"
		}
	}
	return "remote"
}

// orders is the quick start's service. Its handler answers with the attempt
// it ran under, which tollgate's server interceptor put in its context.
type orders struct {
	quickstartv1.UnimplementedOrderServiceServer
}

func (orders) PlaceOrder(ctx context.Context, req *quickstartv1.PlaceOrderRequest) (*quickstartv1.PlaceOrderResponse, error) {
	a, _ := interceptor.AttemptFromContext(ctx)
	return &quickstartv1.PlaceOrderResponse{AttemptId: a.ID}, nil
}

// client is the quick start's client: it places an order at addr, reads its
// record, and reads the outcome of a call that cannot be made in time.
func client(ctx context.Context, addr string, out io.Writer) error {
	opts := append(interceptor.DialOptions(
		interceptor.WithAllowance(4),                                // units all layers below may spend
		interceptor.WithAttemptTimeout(10*time.Second),              // the attempt's one deadline
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3}), // this edge's repeats
	), grpc.WithTransportCredentials(insecure.NewCredentials())) // or your TLS credentials
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	orders := quickstartv1.NewOrderServiceClient(conn)

	// Each call made without an incoming attempt starts a new attempt. A
	// refusal that is final ends that attempt, but one NOT_ADMITTED had no
	// effect anywhere, so a new attempt may follow once its retry-after has
	// passed. A server refuses so, ATTEMPT_UNVERIFIABLE, the attempts of
	// trusted callers created within the clock skew (500 ms) after its store
	// began: the store cannot vouch that no earlier try of them ran.
	var placed *quickstartv1.PlaceOrderResponse
	for attempts := 1; ; attempts++ {
		placed, err = orders.PlaceOrder(ctx, &quickstartv1.PlaceOrderRequest{Item: "book"})
		wait, ok := status.RetryAfter(err)
		if err == nil || status.OutcomeOf(err).Kind != status.KindNotAdmitted || !ok || attempts == 5 {
			break
		}
		fmt.Fprintf(out, "attempt %d: %s; a new attempt in %v\n", attempts, describe(err), wait.Round(time.Millisecond))
		time.Sleep(wait)
	}
	if err != nil {
		return fmt.Errorf("placing the order: %w", err)
	}
	fmt.Fprintf(out, "placed the order under attempt %s\n", placed.GetAttemptId())

	// The server kept a record of the call: the first call of an attempt is
	// call "0" (DESIGN §2.2).
	rec, err := tollgatev1.NewAttemptServiceClient(conn).GetAttempt(ctx, &tollgatev1.GetAttemptRequest{
		AttemptId: placed.GetAttemptId(), Call: "0", Method: quickstartv1.OrderService_PlaceOrder_FullMethodName})
	if err != nil {
		return fmt.Errorf("reading the order's record: %w", err)
	}
	fmt.Fprintf(out, "its record: %s (try %d)\n", rec.GetState(), rec.GetTry())

	// A call whose caller leaves it too little time is refused before it is
	// sent.
	short, cancel := context.WithTimeout(ctx, time.Microsecond)
	defer cancel()
	_, err = orders.PlaceOrder(short, &quickstartv1.PlaceOrderRequest{Item: "lamp"})
	fmt.Fprintf(out, "a call with 1µs to spare: %s\n", describe(err))
	return nil
}

// describe says what a failed call means, as status.OutcomeOf reads it.
func describe(err error) string {
	switch o := status.OutcomeOf(err); o.Kind {
	case status.KindNotAdmitted: // no effect anywhere below: safe to try again later (unless o.Final())
		return fmt.Sprintf("not admitted (%s, final %t): it had no effect anywhere", status.ReasonName(o.Reason), o.Final())
	case status.KindUnknown: // may have happened: do not repeat blindly; o.Detail.GetAttemptId() names it
		return "outcome unknown: attempt " + o.Detail.GetAttemptId() + " may have taken effect"
	case status.KindCommitted: // happened; the response is not available
		return "committed: it took effect, and its response is gone"
	case status.KindFailed: // a definite error
		return "failed: " + err.Error()
	}
	return "succeeded"
}

package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// WithReplicas takes a time.Duration, but WAIT counts whole milliseconds and
// WAIT n 0 blocks for ever. A sub-millisecond timeout is a positive
// duration, so New accepts it; then every call whose context has a deadline
// answers TooLittleTimeError however much time it has (the timeout, under
// 1 ms, is taken for too little), and a call without a deadline sends
// WAIT n 0, which waits until the socket's ReadTimeout (and go-redis then
// sends the script again) or for ever. Options are checked at
// construction: New must refuse it.
func TestRegression13SubMillisecondWaitTimeoutRefused(t *testing.T) {
	c, prefix := newClient(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p),
		clockOption(clock), redisstore.WithReplicas(1, 500*time.Microsecond))
	if err == nil {
		// What such a store does: a Begin with 5 s left is refused as
		// having too little time.
		k := idempotency.Key{AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, berr := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second), Minted: true})
		t.Fatalf("New accepted WithReplicas(1, 500µs), which is WAIT 1 0 (wait for ever); a Begin with 5 s left answers: %v", berr)
	}
}

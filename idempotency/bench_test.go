package idempotency_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// BenchmarkMemoryStoreBeginFinish measures what a recorded unary call costs
// the memory store: the request's fingerprint, Begin, and Finish with a
// 64-byte response kept. Each call has its own call key (building it is one
// of the allocations).
func BenchmarkMemoryStoreBeginFinish(b *testing.B) {
	s, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithMaxRecords(1<<30), idempotency.WithMaxBytes(1<<40))
	if err != nil {
		b.Fatal(err)
	}
	beginFinish(b, s)
}

// beginFinish runs the Begin+Finish benchmark against s, whose horizon must
// have started before the call.
func beginFinish(b *testing.B, s idempotency.Store) {
	p := idempotency.DefaultPolicy()
	// An attempt created skew after the store's horizon.
	id := storetest.AttemptIDAt(time.Now().Add(p.Skew))
	const method = "/shop.v1.Orders/Place"
	req := make([]byte, 128)
	resp := make([]byte, 64)
	deadline := time.Now().Add(time.Minute)
	var next atomic.Int64
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := idempotency.Key{Tenant: "acme", AttemptID: id, Call: strconv.FormatInt(next.Add(1), 10), Method: method}
			fp := idempotency.Fingerprint(method, req)
			res, err := s.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Fingerprint: fp, Deadline: deadline})
			if err != nil || !res.Started {
				b.Fatal(err, res.Refusal)
			}
			if err := s.Finish(ctx, idempotency.FinishRequest{Key: key, Try: 1, Fingerprint: fp,
				State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: resp}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

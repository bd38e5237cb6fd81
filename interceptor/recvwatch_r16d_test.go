package interceptor

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
)

// recvWatches, on the path every server-streaming call received first
// takes with tollgate's admission tap, adds no allocation, and tells the
// tap's bound (values added to it, as grpc-go's are) from a context a stats
// handler or an outer interceptor derived with a cancellation of its own;
// readerEnded reports the bound's end, not that context's.
func TestR16dRecvWatchesIsAllocationFree(t *testing.T) {
	limit := time.Now().Add(time.Minute)
	bctx, cancel := context.WithDeadline(context.Background(), limit)
	defer cancel()
	var ctx context.Context = &tapBound{Context: bctx, limit: limit}
	ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("k", "v"))
	ctx = context.WithValue(ctx, struct{ k int }{1}, 1)
	if !recvWatches(ctx) {
		t.Fatal("the tap's bound, values added, is watched")
	}
	if n := testing.AllocsPerRun(100, func() { _ = recvWatches(ctx) }); n != 0 {
		t.Fatalf("recvWatches allocates %v times", n)
	}
	tagged, tcancel := context.WithCancel(ctx)
	if recvWatches(tagged) {
		t.Fatal("a context with a cancellation of its own is not watched")
	}
	tcancel()
	if readerEnded(tagged) {
		t.Fatal("the tap's bound has not ended")
	}
	cancel()
	if !readerEnded(tagged) {
		t.Fatal("the tap's bound has ended")
	}
	if readerEnded(context.Background()) || recvWatches(context.Background()) {
		t.Fatal("no bound: no evidence")
	}
}

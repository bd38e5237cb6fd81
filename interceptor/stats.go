package interceptor

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/internal/header"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// delivery records what the stats handler saw of one try: whether its
// headers were queued (OutHeader: it may have been sent) and whether the
// peer's status arrived (InTrailer). The client interceptor puts one in the
// try's context; the stats handler finds it there (proven in
// internal/grpcfacts).
type delivery struct {
	// method is the full method of the try; an RPC of another method made
	// with the try's context is not the try (see statsHandler.TagRPC).
	method    string
	outHeader atomic.Bool
	inTrailer atomic.Bool
	// tracked is true when the stats handler is known to watch this try:
	// the interceptor was built by DialOptions, which installs both, or the
	// handler's TagRPC saw the try. Without it the client cannot tell sent
	// from not sent and stays conservative (MaybeSent).
	tracked atomic.Bool
	// spent is the callee's tollgate-spent trailer: -1 until one arrives,
	// badSpent when one arrived that does not read (see parseSpent).
	spent atomic.Int64
	// seen is the flag that the stats handler was seen at work on the
	// try's connection (TagRPC of an earlier try): once set, the handler is
	// known to be installed there even for a try that failed before
	// reaching it.
	seen *atomic.Bool
	// pushback is the callee's grpc-retry-pushback-ms trailer in ms:
	// noPushback when absent, stopPushback when it says not to retry
	// (negative or unparseable, as grpc-go reads it).
	pushback atomic.Int64
	// own is set when an RPC of the try's own method started with its
	// context (TagRPC): the try itself reached the transport.
	own atomic.Bool
	// sideSent is set when an RPC of another method made with the try's
	// context may have been sent (see sideRPC).
	sideSent atomic.Bool
	// rerootedAt is rerootedTries (rerootedQueries for a resolution
	// query) when the try was readied; rerooted is latched by finish when
	// no RPC of the try's own method started with its context while an RPC
	// carrying some try's (query's) header without its context did (see
	// rerootedTries): the try may have been sent that way.
	rerootedAt uint64
	rerooted   atomic.Bool
}

// rerootedTries counts the RPCs the stats handler saw carrying a try's
// tollgate header (one with a deadline) in a context without that try's
// delivery record: an interceptor below tollgate's sent the try on a
// context not derived from the one it was given (context.Background() with
// the metadata copied, say). Such a try's events reach no record, and
// without this count it would read as never sent, its unit refunded and
// its method repeated without the query. The count is process-wide (the
// stats handler keeps no state and cannot tell whose try it is): a try
// that saw none of its own events while it grew counts as maybe sent, the
// safe side, whichever call the re-rooted RPC belonged to.
var rerootedTries atomic.Uint64

// rerootedQueries counts, as rerootedTries does for tries, the resolution
// queries (an AttemptService RPC carrying a tollgate header: the attempt
// and the tenant, no deadline) the stats handler saw in a context without
// their delivery record: a query an interceptor below tollgate's sent on a
// re-rooted context reached the callee (a FenceAttempt fences the try),
// but reads as never sent without this count. A query that saw none of its
// own events while it grew counts as maybe sent. Kept apart from
// rerootedTries, so that a re-rooted query makes no try maybe sent, nor a
// re-rooted try a query.
var rerootedQueries atomic.Uint64

// sideRPC is the stats handler's record of an RPC of another method than
// its try's made with the try's context, by an interceptor below
// tollgate's: a side RPC (fetching a token, say), or the try itself under a
// method that interceptor renamed (a versioned or legacy path). Nothing the
// stats handler sees tells them apart for sure — a renamed try may send a
// copy of the request, a side RPC the request itself — so such an RPC's
// events are never booked to the try; but when it may have been sent and
// no RPC of the try's own method started, the try may have been sent under
// the other name, and counts as maybe sent.
type sideRPC struct {
	try *delivery
}

const (
	noPushback   = -1
	stopPushback = -2
	// maxPushbackMs is the longest pushback a Duration holds.
	maxPushbackMs = math.MaxInt64 / int64(time.Millisecond)
	// badSpent marks a tollgate-spent trailer that was sent but does not
	// read: a value that is not a decimal in range, or no value. The callee
	// reported something, so the grant is held, never refunded as if
	// nothing was spent.
	badSpent = -2
)

// reset readies d for a new try.
func (d *delivery) reset(method string, tracked bool, seen *atomic.Bool) {
	d.method = method
	d.outHeader.Store(false)
	d.inTrailer.Store(false)
	d.tracked.Store(tracked || (seen != nil && seen.Load()))
	d.seen = seen
	d.spent.Store(-1)
	d.pushback.Store(noPushback)
	d.own.Store(false)
	d.sideSent.Store(false)
	d.rerootedAt = d.rerootedCount().Load()
	d.rerooted.Store(false)
}

// rerootedCount is the count of re-rooted RPCs that may be d's: the
// queries' for a resolution query, the tries' otherwise.
func (d *delivery) rerootedCount() *atomic.Uint64 {
	if strings.HasPrefix(d.method, attemptServicePrefix) {
		return &rerootedQueries
	}
	return &rerootedTries
}

// latchRerooted notes, once the try ended, whether it may have been sent on
// a re-rooted context (see rerootedTries, rerootedQueries): none of its
// own RPC started, and a re-rooted one did meanwhile. Latched, so that
// every later reading of the try's state agrees with the one finish
// settled it by.
func (d *delivery) latchRerooted() {
	if !d.own.Load() && d.rerootedCount().Load() != d.rerootedAt {
		d.rerooted.Store(true)
	}
}

// reported returns the units the callee reported spent, and false when it
// sent no (valid) tollgate-spent trailer.
func (d *delivery) reported() (int64, bool) {
	v := d.spent.Load()
	return v, v >= 0
}

// reportedBadly reports whether the callee sent a tollgate-spent trailer
// that does not read.
func (d *delivery) reportedBadly() bool { return d.spent.Load() == badSpent }

type deliveryKey struct{}

// state returns what the client knows of the try's delivery.
func (d *delivery) state() status.Delivery {
	switch {
	case d.inTrailer.Load():
		return status.PeerStatus
	case d.outHeader.Load() || !d.tracked.Load() || (d.sideSent.Load() && !d.own.Load()) || d.rerooted.Load():
		return status.MaybeSent
	default:
		return status.NotSent
	}
}

// statsHandler is the client stats handler DialOptions installs: it marks the
// try's delivery record and does nothing for calls without one.
type statsHandler struct{}

// TagRPC claims the try's delivery record for the RPC being started, unless
// the RPC is of another method: an interceptor below tollgate's that makes
// a side RPC with the try's context (fetching a token, say) must not have
// that RPC's events booked to the try, or a try it then fails before
// sending would look sent. Such an RPC gets a context with a sideRPC record
// of its own (its only allocations), which keeps its events apart; it may
// still be the try renamed, so if it may have been sent and the try's own
// method never started, the try is maybe sent (see sideRPC). An RPC without
// a record that carries a try's header is counted in rerootedTries; an
// AttemptService RPC without one that carries a tollgate header, in
// rerootedQueries.
func (statsHandler) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	if d == nil {
		switch {
		case info == nil:
		case strings.HasPrefix(info.FullMethodName, attemptServicePrefix):
			if len(metadata.ValueFromOutgoingContext(ctx, headerKey)) > 0 {
				rerootedQueries.Add(1)
			}
		case !isControl(info.FullMethodName) && carriesTry(ctx):
			rerootedTries.Add(1)
		}
		return ctx
	}
	if info != nil && info.FullMethodName != d.method {
		return context.WithValue(ctx, deliveryKey{}, &sideRPC{try: d})
	}
	d.tracked.Store(true)
	d.own.Store(true)
	if d.seen != nil && !d.seen.Load() {
		d.seen.Store(true)
	}
	return ctx
}

// carriesTry reports whether ctx's outgoing metadata holds a tollgate
// header with the attempt's deadline (field d), as every try's does and no
// query's (a query carries only the attempt and the tenant). Field values
// never hold ';' or '=', so the field is found by its key.
func carriesTry(ctx context.Context) bool {
	for _, v := range metadata.ValueFromOutgoingContext(ctx, headerKey) {
		if strings.HasPrefix(v, "d=") || strings.Contains(v, ";d=") {
			return true
		}
	}
	return false
}

func (statsHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s := s.(type) {
	case *stats.OutHeader:
		switch r := ctx.Value(deliveryKey{}).(type) {
		case *delivery:
			if r != nil {
				r.outHeader.Store(true)
			}
		case *sideRPC:
			r.try.sideSent.Store(true) // it may be the try, renamed
		}
	case *stats.InTrailer:
		if r, _ := ctx.Value(deliveryKey{}).(*delivery); r != nil {
			r.trailer(s.Trailer)
		}
	}
}

// trailer records the peer's trailer tr: the try's status arrived.
func (d *delivery) trailer(tr metadata.MD) {
	// grpc-go's trailer keys are lower case, as both keys are: index the
	// map rather than MD.Get, which lowers the key.
	if vs, sent := tr[spentTrailerKey]; sent {
		if n, ok := parseSpent(vs); ok {
			d.spent.Store(n)
		} else {
			d.spent.Store(badSpent)
		}
	}
	if vs := tr[status.PushbackKey]; len(vs) > 0 {
		d.pushback.Store(parsePushback(vs))
	}
	d.inTrailer.Store(true)
}

func (statsHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (statsHandler) HandleConn(context.Context, stats.ConnStats)                       {}

// parseSpent reads a tollgate-spent trailer: strict decimals in
// [0, 1,000,000], and the largest of them when there are several. A
// handler that relays its upstream's trailer (a gateway) adds the
// upstream's report to its own server's: each counts everything below the
// hop that sent it, so the largest is the gateway's own (which includes its
// upstream's), or, behind a proxy that lent nothing itself, the upstream's.
// Taking the largest never reports less than any hop did. Anything that does
// not read (badSpent) makes the grant held, in lenient accounting too, the
// safe side.
func parseSpent(vs []string) (int64, bool) {
	if len(vs) == 0 {
		return 0, false
	}
	var most uint64
	for _, v := range vs {
		n, err := header.Decimal(v, 0, maxUnitsOnWire)
		if err != nil {
			return 0, false
		}
		most = max(most, n)
	}
	return int64(most), true
}

// parsePushback reads grpc-retry-pushback-ms as grpc-go does
// (strconv.Atoi: a sign and leading zeros are accepted; an error or a
// negative value means "do not retry"); but several values (a hop that
// relays its upstream's trailer adds the upstream's to its own server's)
// read as their largest, and "do not retry" if any says so.
func parsePushback(vs []string) int64 {
	if len(vs) == 0 {
		return stopPushback
	}
	var most int64
	for _, v := range vs {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return stopPushback
		}
		// Saturated, so that a wait of centuries stays one as a Duration
		// rather than wrapping negative.
		most = max(most, min(int64(n), maxPushbackMs))
	}
	return most
}

package interceptor

import (
	"context"
	"errors"
	"io"
	"math"
	"sync"

	"github.com/tollgate-go/tollgate/internal/header"
	"github.com/tollgate-go/tollgate/internal/methodinfo"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// StreamReplayLimit is how many bytes (proto.Size) of the messages a caller
// sends on a client- or bidi-streaming call the client interceptor keeps, as
// copies, to replay them on a repeat. Past it, replay is off for the rest of
// the stream: a failure is resolved with the callee's AttemptService, never
// replayed.
//
// How a stream is repeated (DESIGN.md §3.4, §3.5; the RetryPolicy, retry
// budget, allowance and deadline of unary calls apply, each try spends a unit
// and is settled as a unary try is):
//
//   - a server-streaming call is repeated only while no response message
//     arrived (a header alone does not commit it);
//   - a client- or bidi-streaming call is repeated only while no response
//     header or message arrived and what the caller sent fits
//     StreamReplayLimit; the repeat replays it (and CloseSend, if the caller
//     closed its side);
//   - a NO_SIDE_EFFECTS stream is repeated while no response message
//     arrived, whatever its kind;
//   - a try is repeated only when its outcome allows it, as for unary
//     calls: NOT_ADMITTED and not final (a try never sent without a
//     definite code included), or UNKNOWN resolved
//     FENCED by the query (NO_SIDE_EFFECTS: freely);
//   - a resolution that finds a finished record under a WithCallKey key, while
//     the stream can still be repeated, is followed by one verifying try, as
//     for unary calls: sent at once, on the resolution's retry-budget token,
//     at the origin past a spent allowance (the store answers it from the
//     record), but within the attempt's deadline (a unary call's may use the
//     resolution's grace);
//   - once committed, a failure is final for the stream: UNKNOWN is resolved
//     with the query for a method with side effects and ends COMMITTED (the
//     stored record cannot replay a stream), FAILED or UNKNOWN.
//
// Repeats happen inside RecvMsg, SendMsg and Header: the caller sees one
// stream. A RetryPolicy's PerTryTimeout does not apply to streams: a stream's
// try may last until the attempt's deadline.
const StreamReplayLimit = 256 << 10

// unaryStreamDesc describes a unary call sent as a stream (the resolution
// query, through the streamer).
var unaryStreamDesc = &grpc.StreamDesc{}

// streamInvoker sends unary calls through streamer, as grpc-go's own invoke
// does: the stream interceptor's queries go to what lies below it, never
// back through the chain (DESIGN.md §3.4).
func streamInvoker(streamer grpc.Streamer) grpc.UnaryInvoker {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := streamer(ctx, unaryStreamDesc, cc, method, opts...)
		if err != nil {
			return err
		}
		if err := st.SendMsg(req); err != nil {
			return err
		}
		return st.RecvMsg(reply)
	}
}

// newClientStream returns the stream of call cl, before its first try.
func newClientStream(ctx context.Context, c *client, cl *call, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts []grpc.CallOption) *clientStream {
	_, named := ctx.Value(callNameKey{}).(string)
	info := methodinfo.Of(method)
	cs := &clientStream{
		desc:          desc,
		streamer:      streamer,
		opts:          opts,
		p:             *c.policy(method),
		headerCommits: desc.ClientStreams && info.Level != methodinfo.NoSideEffects,
		unaryResponse: !desc.ServerStreams,
		ownCodec:      ownCodec(opts),
	}
	cs.p.PerTryTimeout = math.MaxInt64 // each try may last until the deadline
	cs.w = &owner{c: c, cl: cl, p: &cs.p, tgt: cl.tgt, cc: cc,
		invoker: streamInvoker(streamer), explicit: named, callOpts: opts}
	cs.cond.L = &cs.mu
	return cs
}

// tryFromLocked sends tries from try n until one is under way (true), or
// the stream ended instead (false; cs.final holds its result).
func (cs *clientStream) tryFromLocked(n uint32) bool {
	w, c := cs.w, cs.w.c
	for {
		cs.counted++
		// A fresh call per try, so that a late stats event of an earlier
		// try cannot mark this one's delivery record.
		// A verifying try (owner.verifyNext) needs no unit at the origin,
		// as a unary call's; it runs on the caller's context (no grace).
		verifyTry := w.verifyNext
		tcl := &call{s: w.cl.s, key: w.cl.key, method: w.cl.method, seen: w.cl.seen, verifying: verifyTry}
		w.verifyNext = false
		now := c.cfg.now()
		if n > 1 {
			// Asked just before the repeat is sent, as owner.run asks: a
			// recordless mark that came since the resolution (another
			// call's query) is heeded.
			if result := w.refuseRepeat(n, w.follows, verifyTry); result != nil {
				cs.endLocked(w.spanTry(n), result)
				return false
			}
		}
		tctx, t, err := c.prepare(cs.ctx, tcl, n, &cs.p, now)
		if err != nil {
			cs.endLocked(w.spanTry(n), w.unprepared(n, err, verifyTry))
			return false
		}
		w.prepared(cs.ctx, n)
		if n == 1 && w.tgt.budget != nil {
			w.tgt.budget.Deposit()
		}
		cs.t, cs.n, cs.settled, cs.verifyTry = t, n, false, verifyTry
		cs.gen++
		st, err := cs.newTryStreamLocked(tctx)
		if err == nil {
			cs.cur = st
			cs.side.started(st)
			cs.replayLocked(st)
			return true
		}
		next, result, repeat := cs.afterTryLocked(err)
		if !repeat {
			cs.endLocked(cs.n, result)
			return false
		}
		n = next
	}
}

// recvUnlocked receives the next message of cur (its header first, with
// watch) without cs.mu, which the caller holds and gets back however the
// receive ends. A panic below the interceptor (an inner interceptor, a
// codec) goes on up to the caller, but first ends the stream (see
// panickedLocked): the caller's deferred unlock then finds the lock held, as
// it must.
func (cs *clientStream) recvUnlocked(cur grpc.ClientStream, m any, watch bool) (md metadata.MD, err error) {
	cs.mu.Unlock()
	returned := false
	defer func() {
		cs.mu.Lock()
		if !returned {
			cs.receiving = false
			cs.cond.Broadcast()
			cs.panickedLocked()
		}
	}()
	if watch {
		md, _ = cur.Header()
	}
	err = cur.RecvMsg(m)
	returned = true
	return md, err
}

// headerUnlocked is cur.Header without cs.mu, as recvUnlocked is RecvMsg.
func (cs *clientStream) headerUnlocked(cur grpc.ClientStream) (md metadata.MD, err error) {
	cs.mu.Unlock()
	returned := false
	defer func() {
		cs.mu.Lock()
		if !returned {
			cs.panickedLocked()
		}
	}()
	md, err = cur.Header()
	returned = true
	return md, err
}

// panickedLocked ends the stream when a panic below the interceptor passes
// through one of its methods, as an abandoned stream ends: the current try
// is settled (as sent or not, as the stats handler saw it) unless it was
// already, the span ends, and the stream's other methods return its typed
// result instead of sending another try.
func (cs *clientStream) panickedLocked() {
	if cs.done {
		return
	}
	err := errors.New("interceptor: a panic below the interceptor ended the stream")
	if cs.settled {
		// The panic came while the owner resolved or repeated a try it
		// had settled: the outcome of that try is not known.
		cs.endLocked(cs.n, status.OutcomeUnknown(err, status.WithAttempt(cs.w.cl.s.ID, cs.w.cl.key, cs.n)))
		return
	}
	o := cs.finishLocked(err)
	cs.endLocked(cs.n, cs.w.conclude(cs.n, cs.w.typed(cs.n, err, o)))
}

// newTryStreamLocked opens the current try's stream. A panic below the
// interceptor (an inner interceptor, a codec) goes on up to the caller, but
// first ends the stream, as an abandoned one ends: the try is settled (as
// sent or not, as the stats handler saw it), the span ends, and the
// stream's other methods return its typed result instead of sending
// another try.
func (cs *clientStream) newTryStreamLocked(ctx context.Context) (grpc.ClientStream, error) {
	opened := false
	defer func() {
		if !opened {
			cs.panickedLocked()
		}
	}()
	gen := cs.gen
	opts := append(cs.opts[:len(cs.opts):len(cs.opts)], grpc.OnFinish(func(err error) { cs.tryFinished(gen, ctx, err) }))
	st, err := cs.streamer(ctx, cs.desc, cs.w.cc, cs.w.cl.method, opts...)
	opened = true
	return st, err
}

// tryFinished is the OnFinish of the try of generation gen, whose context
// is tctx: grpc-go ran it because the try's stream ended, whatever ended it.
// Two ends come while the caller's context lives and may leave nothing of
// the caller's to see them: the ClientConn closed (the conn is shut down),
// or the try's own deadline passed (the attempt's, or the caller's, less
// the hop margin: a stream's try has no shorter one). grpc-go ends its
// stream at either, read or not, and runs OnFinish; so, when no RecvMsg is
// under way to do it, the stream is ended here, as a read would have ended
// it, or released (see releaseLocked) when the caller still has something
// to read: the try's status, or messages that came before the deadline.
// Any other end is an answer, which the caller reads. grpc-go may run this
// while the owner holds cs.mu (a try that failed to open), so the work is
// done on a goroutine of its own, which ends with it.
func (cs *clientStream) tryFinished(gen uint64, tctx context.Context, err error) {
	if cs.ctx.Err() != nil {
		return // the caller's own end (abandon)
	}
	expired := errors.Is(tctx.Err(), context.DeadlineExceeded)
	if !expired && (cs.w.cc == nil || cs.w.cc.GetState() != connectivity.Shutdown) {
		return // an answer (a peer's CANCELLED too), which the caller reads
	}
	go func() {
		defer func() {
			// A panic below the interceptor in a resolution query ended the
			// stream (expireLocked); on this goroutine it is logged.
			if r := recover(); r != nil {
				logger.Errorf("interceptor: a panic below the interceptor while a stream was ended unread: %v", r)
			}
		}()
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.done || gen != cs.gen || cs.settled || cs.released {
			return // ended, or the owner sees it
		}
		if cs.receiving {
			// The RecvMsg under way sees the end, or returns a message
			// that came before it: then it ends the stream here after
			// (unreadEndLocked).
			cs.unreadEnd = tryEnd{gen: gen, err: err, expired: expired, set: true}
			return
		}
		cs.endUnreadLocked(err, expired)
	}()
}

// tryEnd is a try's end that tryFinished saw while a RecvMsg was under way.
type tryEnd struct {
	gen     uint64
	err     error
	expired bool
	set     bool
}

// endUnreadLocked ends the current try, which ended with err while nothing
// read the stream (expired: by its deadline; else by the ClientConn's
// close): released when its status arrived first, so that the caller's
// reads still drain its messages and that status; decided and released
// when cut by its deadline (expireLocked); ended otherwise.
func (cs *clientStream) endUnreadLocked(err error, expired bool) {
	switch {
	case cs.t.delivery.state() == status.PeerStatus:
		cs.releaseLocked(err)
	case expired:
		cs.expireLocked(err)
	default:
		o := cs.finishLocked(err)
		cs.endKeepingLocked(cs.w.conclude(cs.n, cs.w.typed(cs.n, err, o)))
	}
}

// unreadEndLocked applies, after a RecvMsg returned a message, the end of
// its try that tryFinished saw meanwhile: the caller may read no more.
func (cs *clientStream) unreadEndLocked() {
	e := cs.unreadEnd
	cs.unreadEnd = tryEnd{}
	if e.set && e.gen == cs.gen && !cs.done && !cs.settled && !cs.released && cs.ctx.Err() == nil {
		cs.endUnreadLocked(e.err, e.expired)
	}
}

// expireLocked ends the current try, cut by its deadline or the caller's
// (err) while nothing read the stream: its outcome is decided, and resolved when unknown, as a
// RecvMsg that saw the cut would; then the stream is released with that
// result, so that the caller's reads still get the messages that arrived
// before the cut (grpc-go hands them out before the deadline's error) and
// then the same result.
func (cs *clientStream) expireLocked(err error) {
	var (
		next   uint32
		result error
		repeat bool
	)
	cs.guardedLocked(func() { next, result, repeat = cs.afterTryLocked(err) }) // a query may panic
	if repeat {
		cs.tryFromLocked(next) // never under way after the deadline; nothing was read of the cut try
		return
	}
	cs.endKeepingLocked(result)
}

// replayLocked sends what the caller sent so far on a new try's stream,
// then hands the stream to CloseSend and Trailer, and closes its side if the
// caller closed its own. A failure shows on the stream itself, where the
// caller's next operation finds it.
//
// With messages to replay it does so on a goroutine of its own, and returns
// at once: the caller's RecvMsg (which may be what repeats the stream) must
// go on reading the new try's responses meanwhile, or a handler that answers
// each message with more than the flow-control window holds stops reading,
// and a replay larger than the window blocks for good. SendMsg waits until
// the replay ends. The goroutine ends with the replay: a stream's SendMsg
// returns once the stream ends.
func (cs *clientStream) replayLocked(st grpc.ClientStream) {
	if len(cs.buf) == 0 {
		cs.openLocked(st, nil)
		return
	}
	buf, gen := cs.buf, cs.gen // buf's messages are clones, never written again
	cs.replaying = true
	go func() {
		panicked, err := replay(st, buf)
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if gen != cs.gen {
			return // a later try is current (this one ended): it has its own replay
		}
		cs.replaying = false
		cs.cond.Broadcast()
		if panicked == nil {
			panicked = cs.openRecoveringLocked(st, err)
		}
		if panicked != nil {
			// On tollgate's own goroutine, where the caller cannot recover
			// it: logged, and the stream ends as a panic below ends it.
			logger.Errorf("interceptor: a panic below the interceptor while a stream was replayed: %v", panicked)
			cs.panickedLocked()
		}
	}()
}

// openRecoveringLocked is openLocked on the replay's goroutine, recovering a
// panic in an inner interceptor's CloseSend.
func (cs *clientStream) openRecoveringLocked(st grpc.ClientStream, err error) (panicked any) {
	defer func() {
		panicked = recover()
	}()
	cs.openLocked(st, err)
	return nil
}

// replay sends buf on st, stopping at the first error, and recovers a panic
// below the interceptor (an inner interceptor's SendMsg, a codec).
func replay(st grpc.ClientStream, buf []any) (panicked any, err error) {
	defer func() {
		panicked = recover()
	}()
	for _, m := range buf {
		if err = st.SendMsg(m); err != nil {
			break
		}
	}
	return nil, err
}

// openLocked makes st, on which what the caller sent was replayed (with
// err), the stream CloseSend and Trailer act on, and closes its side if the
// caller closed its own. Only now may CloseSend reach st: grpc-go forbids
// calling CloseSend concurrently with SendMsg.
func (cs *clientStream) openLocked(st grpc.ClientStream, err error) {
	if cs.side.open(st) && err == nil {
		_ = st.CloseSend()
	}
}

// streamSide is what CloseSend and Trailer need of a clientStream: the
// streams they act on and whether the caller closed its side. Its lock is
// its own, not clientStream.mu, which the owner holds while it resolves and
// repeats a try (queries that may poll until the deadline): neither
// CloseSend nor Trailer waits for that. The lock is held only to read or
// write these fields, never across a call on a stream; the order is
// clientStream.mu, then streamSide.mu. The zero value has no stream and is
// open.
//
// cur changes to a new try's stream only once what the caller sent was
// replayed on it, under the lock that also reads closed: a CloseSend is
// ordered either before (it closed an earlier stream, and open tells the
// owner to close this one) or after (it finds this one). So the caller's
// half-close reaches every try that follows it, each stream is closed by
// one of them at most (grpc-go's CloseSend must not run twice at once), and
// never while the owner still replays on it.
type streamSide struct {
	mu     sync.Mutex
	cur    grpc.ClientStream // the latest try's stream that was replayed, for CloseSend
	last   grpc.ClientStream // the latest try's stream, replayed or not, for Trailer
	closed bool              // the caller called CloseSend
}

// started notes st, a new try's stream, as the one Trailer reads: a try
// may end, and the stream with it, while its replay still runs.
func (s *streamSide) started(st grpc.ClientStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = st
}

// open makes st, a new try's stream on which what the caller sent was
// replayed, the one CloseSend and Trailer act on. It reports whether the
// caller has closed its side: the owner must then close st's.
func (s *streamSide) open(st grpc.ClientStream) (closed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = st
	return s.closed
}

// close notes that the caller closed its side and returns the stream to
// close: nil when the caller had closed it already (the owner closes every
// stream opened since).
func (s *streamSide) close() grpc.ClientStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.cur
}

// stream returns the latest try's stream (nil before the first).
func (s *streamSide) stream() grpc.ClientStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// replayable reports whether the current try may still be repeated.
func (cs *clientStream) replayable() bool {
	return !cs.message && !cs.overflow && !(cs.header && cs.headerCommits) && !cs.headerRead
}

// sawHeaderLocked notes a response header of the current try. A try
// answered with a header was sent, whatever the stats handler saw: it is
// settled and classified as one that may have had an effect.
func (cs *clientStream) sawHeaderLocked() {
	cs.header = true
	cs.t.delivery.outHeader.Store(true)
	if cs.headerCommits {
		cs.buf = nil
	}
}

// sawMessageLocked notes a response message: the stream is committed.
func (cs *clientStream) sawMessageLocked() {
	cs.message = true
	cs.buf = nil
}

// keepLocked keeps a copy of m for replay while the stream may be repeated.
func (cs *clientStream) keepLocked(m any) {
	if !cs.replayable() {
		return
	}
	pm, ok := m.(proto.Message)
	size := 0
	if ok {
		size = proto.Size(pm)
	}
	// A server-streaming call's one request is kept whatever its size.
	if !ok || (cs.desc.ClientStreams && cs.bufBytes+size > StreamReplayLimit) {
		cs.overflow = true
		cs.buf = nil
		return
	}
	cs.buf = append(cs.buf, proto.Clone(pm))
	cs.bufBytes += size
}

// endLocked ends the stream after try n with result (nil: OK).
func (cs *clientStream) endLocked(n uint32, result error) { cs.endReportingLocked(n, result, result) }

// endReportingLocked ends the stream after try n with result (nil: OK),
// which its reads return, reporting reported to its span and OnFinish.
func (cs *clientStream) endReportingLocked(n uint32, result, reported error) {
	cs.done = true
	cs.final = result
	if result == nil {
		cs.final = io.EOF
	}
	cs.buf = nil
	if cs.stop != nil {
		cs.stop()
	}
	cs.endCtx()
	cs.cond.Broadcast()
	if cs.released {
		return // the span ended and OnFinish ran when the stream was released
	}
	endSpan(cs.span, cs.w.cl.s, n, status.OutcomeOf(reported))
	runOnFinish(cs.onFinish, reported)
}

// abandon ends the stream when the caller's context ends and no RecvMsg is
// under way to see it: grpc-go lets a caller release a stream by cancelling
// its context, and the try's grant and the span must not stay open. The try
// may have been sent: its grant is held, as for a lost call.
func (cs *clientStream) abandon() {
	defer func() {
		// This runs on a goroutine of context.AfterFunc's: a panic below
		// the interceptor in a resolution query, which ended the stream
		// (settleLocked), would end the process here; it is logged.
		if r := recover(); r != nil {
			logger.Errorf("interceptor: a panic below the interceptor while a stream was ended by its context: %v", r)
		}
	}()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.done || cs.receiving {
		return // ended, or the RecvMsg under way ends it (abandonLocked)
	}
	cs.abandonLocked()
}

// abandonLocked ends the stream whose caller's context ended. A deadline
// ends it as a RecvMsg that saw it would: the try is decided, and resolved
// when its outcome is unknown (the queries have their grace after the
// deadline), so the answer does not depend on whether the caller happened
// to be inside RecvMsg (expireLocked). A cancellation ends it at once,
// UNKNOWN (or NOT_SENT), naming the attempt: the caller has gone. Either
// way the stream is released with that result, so that, as grpc-go's, the
// caller's reads still get the messages that had arrived.
func (cs *clientStream) abandonLocked() {
	if cs.released {
		return
	}
	cerr := cs.ctx.Err()
	err := grpcstatus.FromContextError(cerr).Err()
	if !cs.settled && cs.t.delivery.state() == status.PeerStatus {
		cs.releaseLocked(err)
		return
	}
	if errors.Is(cerr, context.DeadlineExceeded) {
		cs.expireLocked(err) // decided and resolved as a read would; reads still drain what arrived
		return
	}
	o := cs.finishLocked(err)
	cs.endKeepingLocked(cs.w.conclude(cs.n, cs.w.typed(cs.n, err, o)))
}

// endKeepingLocked ends the current try's bookkeeping with result and
// releases the stream: as grpc-go's, the caller's reads still get the
// messages that arrived before the end, then result (the try's stream was
// cancelled by its settlement, so they do not wait).
func (cs *clientStream) endKeepingLocked(result error) {
	cs.kept, cs.keptSet = result, true
	cs.releaseWithLocked(result)
}

// releaseLocked releases a stream whose caller's context ended, or whose
// ClientConn closed or try's deadline passed (err), after its try's status
// arrived, unread: as grpc-go's, the caller's reads still
// drain its messages and the real status, so the stream does not end; but
// the caller may have gone, so its bookkeeping ends now: the try is settled
// (from its tollgate-spent when it came), the span ends and the caller's
// OnFinish runs, with err. The stream's later end does neither again.
func (cs *clientStream) releaseLocked(err error) {
	if !cs.receiving && !cs.settled {
		// Nothing reads the stream now: read what arrived, up to the
		// status, so that the try is settled by the peer's status (its
		// grant refunded when that proves nothing spent) and the stream
		// ends with it; the caller's reads get the messages, then that
		// status, as grpc-go's would.
		if ok, _, peerErr := cs.drainLocked(cs.cur, nil); ok {
			if peerErr != nil {
				cs.settleLocked(peerErr) // decided, and resolved, as a read would decide it
				return
			}
			// OK: nothing spent unless its trailer says so. The span and
			// OnFinish report the release (err), as grpc-go's OnFinish
			// does a close or a cancellation.
			o := cs.finishLocked(nil)
			final := cs.w.conclude(cs.n, cs.w.typed(cs.n, nil, o))
			reported := cs.w.conclude(cs.n, cs.w.typed(cs.n, err, status.OutcomeOfCall(err, status.PeerStatus)))
			cs.endReportingLocked(cs.n, final, reported)
			return
		}
	}
	o := cs.finishLocked(err)
	cs.releaseWithLocked(cs.w.conclude(cs.n, cs.w.typed(cs.n, err, o)))
}

// releaseWithLocked ends a stream's bookkeeping with result, leaving the
// stream readable.
func (cs *clientStream) releaseWithLocked(result error) {
	cs.released = true
	if cs.stop != nil {
		cs.stop()
	}
	cs.endCtx()
	endSpan(cs.span, cs.w.cl.s, cs.n, status.OutcomeOf(result))
	runOnFinish(cs.onFinish, result)
}

// settleLocked ends the current try with err (nil or io.EOF: OK) and either
// starts the next try or ends the stream.
func (cs *clientStream) settleLocked(err error) {
	cs.guardedLocked(func() { cs.settleTryLocked(err) }) // a query or a repeat may panic
}

// guardedLocked runs f, which calls below the interceptor (a query, a
// repeat, a codec), with cs.mu held: a panic there goes on up to the caller,
// but first ends the stream (see panickedLocked).
func (cs *clientStream) guardedLocked(f func()) {
	returned := false
	defer func() {
		if !returned {
			cs.panickedLocked()
		}
	}()
	f()
	returned = true
}

func (cs *clientStream) settleTryLocked(err error) {
	if cs.keptSet {
		cs.endLocked(cs.n, cs.kept) // the result the stream was released with
		return
	}
	if err == io.EOF {
		err = nil
	}
	next, result, repeat := cs.afterTryLocked(err)
	if !repeat {
		cs.endLocked(cs.n, result)
		return
	}
	cs.tryFromLocked(next)
}

// afterTryLocked settles the current try, which ended with err (nil: OK),
// and decides, as owner.run does for a unary call, whether the stream
// repeats (at try next) or ends with result.
func (cs *clientStream) afterTryLocked(err error) (next uint32, result error, repeat bool) {
	w, n := cs.w, cs.n
	o := cs.finishLocked(err)
	err = w.typed(n, err, o)
	o = finalTyped(o, err)
	o, err = w.relayed(n, o, err, cs.t)
	if failed := w.failedInDoubt(n, err, o, cs.t.delivery.state()); failed != nil {
		return n, failed, false
	}
	if !cs.replayable() {
		return n, cs.committedResult(n, err, o), false
	}
	next, uncounted, result, done := w.decide(cs.ctx, n, err, o, nil)
	if done {
		return n, result, false
	}
	err, n = result, next-1
	if uncounted {
		cs.counted--
	}
	if n+1 > header.MaxTry { // a fence jumped past the last try the header can carry
		return n, w.conclude(w.spanTry(n), err), false // naming the last try sent, not the fence
	}
	if w.verifyNext {
		// The verifying try is answered from the record the resolution
		// found, as a unary call's is (owner.run): sent at once, past the
		// policy's backoff and, at the origin, past a spent allowance; the
		// resolution's retry-budget token covers it. Below the origin it
		// takes a unit as any RPC does. Only the caller's cancellation
		// stops it here; a deadline that leaves it no time is prepare's
		// to find (the call then ends with the try it follows).
		if cancelled(cs.ctx) {
			w.verifyNext = false
			return n, w.conclude(w.spanTry(n), err), false
		}
		// Announced as any repeat is, once prepare lets it go.
		w.retry, w.retrying = retryNote{reason: status.OutcomeOf(err).Reason}, true
		w.follows = err
	} else if result := w.proceed(cs.ctx, n, cs.counted, err); result != nil {
		return n, result, false
	}
	return n + 1, nil, true // tryFromLocked asks unvouchedRepeat just before sending it
}

// finishLocked settles the current try, which ended with err (nil: OK), as
// a unary try is settled, counts it in tollgate.client.tries, and returns
// its outcome.
func (cs *clientStream) finishLocked(err error) status.Outcome { return cs.finishTryLocked(err, false) }

// finishTryLocked is finishLocked; local is set when err is the client's
// own, not how the try ended (see client.finish).
func (cs *clientStream) finishTryLocked(err error, local bool) status.Outcome {
	w, c := cs.w, cs.w.c
	if cs.settled {
		// Settled already (the stream was released): what the try's end
		// says, without settling it twice; but a grant held at the release
		// (its status had arrived unread, with no tollgate-spent) is
		// refunded once the read status proves, as at any try's end, that
		// nothing was spent (DESIGN.md §2.3).
		d := cs.t.delivery.state()
		if cs.released && !local && d == status.PeerStatus && !c.cfg.strict && !cs.t.delivery.reportedBadly() {
			if _, reported := cs.t.delivery.reported(); !reported && spentNothing(err, w.cl.s.ID, w.cl.key, cs.n) {
				c.reconciled(cs.ctx, 0, cs.t.loan)
			}
		}
		if local && d == status.PeerStatus {
			d = status.MaybeSent
		}
		return status.OutcomeOfCall(err, d)
	}
	cs.settled = true
	d := c.finish(w.cl.s, w.cl.key, cs.t, err, local)
	w.unsent(cs.n, d, cs.verifyTry) // every other repeat of a stream waited in proceed, which withdrew a token
	c.spent(cs.ctx, cs.span, w.cl.s, cs.t)
	w.pushback = cs.t.delivery.pushback.Load()
	if cs.t.loan != nil {
		w.loans = append(w.loans, cs.t.loan)
	}
	o := status.OutcomeOfCall(err, d)
	c.record(cs.ctx, o, d)
	return o
}

// committedResult is the result of a stream whose try n failed (or ended)
// when it could no longer be repeated: definite outcomes as they are;
// UNKNOWN resolved with the query for a method with side effects, which
// ends COMMITTED, FAILED or UNKNOWN — and NOT_ADMITTED only when nothing of
// the try was seen and the record was fenced, so it never ran.
func (cs *clientStream) committedResult(n uint32, err error, o status.Outcome) error {
	w := cs.w
	switch {
	case o.Kind == status.KindUnknown,
		o.Kind == status.KindNotAdmitted && o.Reason == status.ReasonAttemptInProgress:
	case o.Kind == status.KindNotAdmitted:
		if o.Reason == status.ReasonAttemptFenced && o.Detail.GetFencedThroughTry() >= n {
			w.doubt = true // a fence of this try (see owner.decide)
		}
		return w.conclude(n, err)
	default:
		return err
	}
	if o.Final() || w.cl.info.Level == methodinfo.NoSideEffects {
		return w.conclude(n, err) // nothing a query could add
	}
	w.doubt = true
	if w.cl.info.Level == methodinfo.Idempotent && w.c.recordless(w.tgt) {
		return w.conclude(n, err)
	}
	w.committed, w.answered = true, cs.header || cs.message
	_, res, done := w.resolve(cs.ctx, n, err, nil)
	if done {
		return res
	}
	if status.OutcomeOf(res).Kind == status.KindNotAdmitted && !cs.header && !cs.message {
		return w.conclude(n, res) // fenced: no try ran here (UNKNOWN when a try repeated unqueried may have); what was sent cannot be replayed
	}
	if status.OutcomeOf(res).Kind == status.KindNotAdmitted {
		return status.OutcomeUnknown(err, status.WithAttempt(w.cl.s.ID, w.cl.key, n), w.ownReason(n, err),
			status.WithMessage("interceptor: the callee answered the stream, yet its record says the try never ran"))
	}
	return w.conclude(n, res)
}

// probeLocked learns how the current try ended when its stream reported the
// end (SendMsg's io.EOF) or no header (Header), and no RecvMsg is under way:
// a header commits it (client and bidi streaming); otherwise the status is
// read, and the try settled, unless a message came first, which is kept for
// the caller's next RecvMsg.
func (cs *clientStream) probeLocked() { cs.guardedLocked(cs.probeUnguardedLocked) }

func (cs *clientStream) probeUnguardedLocked() {
	cur := cs.cur
	if md, _ := cur.Header(); md != nil {
		cs.sawHeaderLocked()
		if !cs.replayable() {
			return
		}
	}
	scratch := cs.scratch()
	err := cur.RecvMsg(scratch)
	if err == nil {
		cs.pending = append(cs.pending, scratch)
		cs.sawMessageLocked()
		if cs.unaryResponse {
			cs.settleLocked(nil)
		}
		return
	}
	cs.settleLocked(err)
}

// drainLocked reads the status that ended cur, whose peer's status
// arrived unread, and reports whether it read one: the messages before it,
// which grpc-go holds already, are read into cs.pending for the caller's
// reads, in order. A read that returns local, the caller's send's own error
// (grpc-go ended the stream with it), reads no status. The caller makes sure
// no RecvMsg is under way.
//
// It reads nothing under a codec the call chose (ForceCodec and the like:
// the messages may not decode into the response type, a raw proxy's never
// do), and stops when the messages it read pass maxDrainBytes (a caller
// that went away would rarely read them): it then reports no status but
// stopped, and what it read stays the caller's.
func (cs *clientStream) drainLocked(cur grpc.ClientStream, local error) (read, stopped bool, peerErr error) {
	if cs.ownCodec {
		return false, true, nil
	}
	size := 0
	for {
		if size > maxDrainBytes {
			return false, true, nil
		}
		scratch := cs.scratch()
		var err error
		cs.guardedLocked(func() { err = cur.RecvMsg(scratch) }) // buffered: the status has arrived
		switch {
		case err == nil:
			cs.pending = append(cs.pending, scratch)
			cs.sawMessageLocked()
			size += proto.Size(scratch)
		case err == io.EOF:
			return true, false, nil
		case local != nil && (err == local || grpcstatus.Convert(err).Proto().String() == grpcstatus.Convert(local).Proto().String()):
			return false, false, nil
		default:
			return true, false, err
		}
	}
}

// scratch is a new message to read a response into on the caller's behalf:
// of the method's response type when the registry knows it, else an Empty
// that keeps every field as unknown (deliverPending copies it whole).
func (cs *clientStream) scratch() proto.Message {
	if out := cs.w.cl.info.Output; out != nil {
		return out.New().Interface()
	}
	return &emptypb.Empty{}
}

// maxDrainBytes bounds the messages drainLocked reads ahead of the caller.
const maxDrainBytes = 1 << 20

// ownCodec reports whether the call's options choose a codec other than
// protobuf's.
func ownCodec(opts []grpc.CallOption) bool {
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.ForceCodecCallOption, grpc.ForceCodecV2CallOption, grpc.CustomCodecCallOption,
			*grpc.ForceCodecCallOption, *grpc.ForceCodecV2CallOption, *grpc.CustomCodecCallOption:
			return true
		case grpc.ContentSubtypeCallOption:
			if o.ContentSubtype != "proto" {
				return true
			}
		case *grpc.ContentSubtypeCallOption:
			if o.ContentSubtype != "proto" {
				return true
			}
		}
	}
	return false
}

// deliverPending copies the message a probe read into the caller's m.
func deliverPending(m, pending any) error {
	pm, ok := m.(proto.Message)
	pp, _ := pending.(proto.Message)
	if !ok || pp == nil {
		return grpcstatus.Error(codes.Internal, "interceptor: a response message could not be handed over")
	}
	b, err := proto.Marshal(pp)
	if err == nil {
		err = proto.Unmarshal(b, pm)
	}
	if err != nil {
		return grpcstatus.Errorf(codes.Internal, "interceptor: a response message could not be handed over: %v", err)
	}
	return nil
}

// sendEnded is what SendMsg returns on a stream that ended: io.EOF, RecvMsg
// returning its status; nil for a unary or server-streaming call, whose
// SendMsg grpc-go documents as returning nil unconditionally on an ended
// stream (the generated stub returns its error to the caller as is).
func (cs *clientStream) sendEnded() error {
	if !cs.desc.ClientStreams {
		return nil
	}
	return io.EOF
}

// SendMsg sends m on the current try, keeping a copy for replay. When the
// try has ended before a response committed the stream, it learns why and
// repeats the stream (m is replayed) before returning nil; io.EOF, as
// grpc-go's, says the stream ended and RecvMsg returns its status. A panic
// below the interceptor goes on up to the caller, but first ends the
// stream (see panickedLocked).
func (cs *clientStream) SendMsg(m any) error {
	cs.mu.Lock()
	for cs.replaying && !cs.done {
		cs.cond.Wait()
	}
	if cs.done {
		cs.mu.Unlock()
		return cs.sendEnded()
	}
	cs.keepLocked(m)
	cur, gen := cs.cur, cs.gen
	cs.mu.Unlock()
	err := cs.sendUnlocked(cur, m)
	if err == nil {
		return nil
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if err != io.EOF {
		// A local error (m cannot be marshalled, or is too large: grpc-go
		// ended the stream with it; or an interceptor below refused it).
		// It is not how the try ended. When the try's status had arrived,
		// unread, and no RecvMsg is under way, that status is read and ends
		// the stream, and the send returns that end; otherwise the try
		// counts as maybe sent (its grant held), never as answered by the
		// local error.
		if cs.released {
			// Its bookkeeping ended when it was released; its reads still
			// drain what arrived, then the result it was released with.
			return err
		}
		stopped := false
		if !cs.done && gen == cs.gen && !cs.settled && !cs.receiving && cs.t.delivery.state() == status.PeerStatus {
			ok, early, peerErr := cs.drainLocked(cur, err)
			if ok {
				o := cs.finishLocked(peerErr)
				cs.endLocked(cs.n, cs.w.conclude(cs.n, cs.w.typed(cs.n, peerErr, o)))
				return cs.final // the stream's end, as RecvMsg will return it after the messages
			}
			stopped = early
		}
		if !cs.done {
			// Typed as RecvMsg would type it (DESIGN.md §2.5: grpc-go's
			// client-side RESOURCE_EXHAUSTED is UNKNOWN): earlier messages
			// may have reached the handler. The stream cannot go on, on
			// this try or on a repeat started meanwhile (gen != cs.gen),
			// which would replay m and fail on it again; as grpc-go's, its
			// reads still get the messages that had arrived.
			o := cs.finishTryLocked(err, true)
			result := cs.w.conclude(cs.n, cs.w.typed(cs.n, err, o))
			if stopped {
				// The peer's status is still to read, behind messages left
				// to the caller: its bookkeeping ends now, and the status
				// settles the try when the caller reads it.
				cs.releaseWithLocked(result)
				return result
			}
			cs.endKeepingLocked(result)
			return result
		}
		return cs.final
	}
	for {
		switch {
		case cs.done:
			return cs.sendEnded()
		case cs.gen != gen:
			return nil // repeated, m replayed
		case !cs.replayable():
			return cs.sendEnded()
		case cs.receiving:
			cs.cond.Wait()
		default:
			cs.probeLocked()
		}
	}
}

// RecvMsg receives the next response message. A try that ends before the
// stream is committed is repeated here, and the caller goes on receiving
// from the new try.
func (cs *clientStream) RecvMsg(m any) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for {
		if len(cs.pending) > 0 {
			p := cs.pending[0]
			cs.pending[0] = nil
			cs.pending = cs.pending[1:]
			return deliverPending(m, p)
		}
		if cs.done {
			return cs.final
		}
		cur, gen := cs.cur, cs.gen
		watch := cs.headerCommits && !cs.header
		cs.receiving = true
		md, err := cs.recvUnlocked(cur, m, watch)
		cs.receiving = false
		cs.cond.Broadcast()
		if gen != cs.gen || cs.done {
			continue
		}
		if md != nil {
			cs.sawHeaderLocked()
		}
		if err == nil {
			cs.sawMessageLocked()
			switch {
			case cs.unaryResponse:
				cs.settleLocked(nil)
			case cs.ctx.Err() != nil:
				// The caller's context ended while this RecvMsg was
				// under way, and abandon left the end to it: the
				// message is the caller's, and the stream ends.
				cs.abandonLocked()
			default:
				cs.unreadEndLocked()
			}
			return nil
		}
		cs.settleLocked(err)
	}
}

// Header returns the current try's response header, waiting for it. When
// the try ended without one, before the stream was committed, it learns why
// and repeats the stream, then waits for the new try's header.
func (cs *clientStream) Header() (metadata.MD, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for {
		cur, gen := cs.cur, cs.gen
		if cs.done {
			return cur.Header()
		}
		md, err := cs.headerUnlocked(cur)
		if gen != cs.gen {
			continue // the try was repeated meanwhile: its header is not the stream's
		}
		if md != nil || err != nil {
			if md != nil && gen == cs.gen && !cs.done {
				cs.sawHeaderLocked()
				// The caller holds this try's header: as grpc-go's, the
				// stream is committed to it, so that its header, messages
				// and trailer are one response's.
				cs.headerRead = true
				cs.buf = nil
			}
			return md, err
		}
		// No header: the try ended. Its status is RecvMsg's to read.
		for gen == cs.gen && !cs.done && cs.receiving {
			cs.cond.Wait()
		}
		switch {
		case gen != cs.gen:
			continue
		case cs.done || !cs.replayable():
			return nil, nil
		}
		cs.probeLocked()
		if gen == cs.gen && !cs.done {
			return nil, nil // a message came before the status: it is the caller's
		}
	}
}

// CloseSend closes the caller's side of the current try, and of every
// repeat. It does not wait for a resolution or repeat under way: a repeat
// that opens later is closed by the owner once it replayed what was sent.
// Like grpc-go's, it returns nil. A panic below the interceptor in the
// try's CloseSend goes on up to the caller, but first ends the stream (see
// panickedLocked), as it does when the owner closes a repeat.
func (cs *clientStream) CloseSend() error {
	if cur := cs.side.close(); cur != nil {
		return cs.closeUnlocked(cur)
	}
	return nil
}

// sendUnlocked is cur.SendMsg(m) on the caller's goroutine, without cs.mu:
// a panic below the interceptor (an inner interceptor, a codec's Marshal)
// goes on up to the caller, but first ends the stream (see panickedLocked),
// as in RecvMsg (recvUnlocked).
func (cs *clientStream) sendUnlocked(cur grpc.ClientStream, m any) error {
	returned := false
	defer cs.endIfPanicked(&returned)
	err := cur.SendMsg(m)
	returned = true
	return err
}

// closeUnlocked is cur.CloseSend on the caller's goroutine, without cs.mu,
// as sendUnlocked is SendMsg.
func (cs *clientStream) closeUnlocked(cur grpc.ClientStream) error {
	returned := false
	defer cs.endIfPanicked(&returned)
	err := cur.CloseSend()
	returned = true
	return err
}

// endIfPanicked, deferred by a call below the interceptor made without
// cs.mu, ends the stream when that call did not return (a panic passes).
func (cs *clientStream) endIfPanicked(returned *bool) {
	if *returned {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.panickedLocked()
}

// Trailer returns the trailer of the stream's last try. As grpc-go's, it is
// for after the stream ended (RecvMsg returned an error, io.EOF included);
// called earlier, it reads a try grpc-go may still be writing.
func (cs *clientStream) Trailer() metadata.MD {
	cur := cs.side.stream()
	if cur == nil {
		return nil
	}
	return cur.Trailer()
}

// Context returns the stream's context: it carries the caller's values
// and the attempt's deadline, and ends when the stream does (or is
// released), not when one of its tries does, so a repeat never cancels what
// the caller holds. grpc-go's stream context is its one try's, which is why
// grpc-go stops repeating once it is asked for; tollgate's repeats go on.
// A try's own peer is in grpc.Peer, as for unary calls.
func (cs *clientStream) Context() context.Context {
	if p := cs.callerCtx.Load(); p != nil {
		return p.ctx
	}
	ctx, cancel := context.WithDeadline(cs.ctx, cs.w.cl.s.deadlineIn(cs.ctx))
	if !cs.callerCtx.CompareAndSwap(nil, &cancelableCtx{ctx: ctx, cancel: cancel}) {
		cancel()
		return cs.callerCtx.Load().ctx
	}
	if cs.ctxEnded.Load() {
		cancel() // the stream ended meanwhile (endCtx saw no context)
	}
	return ctx
}

// cancelableCtx is a context with its cancel function.
type cancelableCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// endCtx ends the context Context handed out, or the one it will hand out.
func (cs *clientStream) endCtx() {
	cs.ctxEnded.Store(true)
	if p := cs.callerCtx.Load(); p != nil {
		p.cancel()
	}
}

package interceptor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/internal/callkey"
	"github.com/tollgate-go/tollgate/internal/methodinfo"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// recorded reports whether calls of the request keep records: a store is
// configured and the method is not declared NO_SIDE_EFFECTS.
func (sv *server) recorded(in *inbound) bool {
	return sv.cfg.store != nil && in.info.Level != methodinfo.NoSideEffects
}

func (in *inbound) key(method string) idempotency.Key {
	return idempotency.Key{Tenant: in.s.Tenant, AttemptID: in.s.ID, Call: in.s.Call, Method: method}
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// fingerprint is the 128-bit fingerprint of (method, request bytes): of a
// unary call's request, and of a server-streaming call's one request, which
// the stream interceptor receives before the handler chain runs when the
// protobuf registry knows the method's request type (and the server was not
// built WithoutStreamRequestFirst). A request that is not a proto message
// (nil included) is fingerprinted by its method alone, as are
// client-streaming and bidi streams, whose requests arrive while the handler
// runs, server-streaming calls of methods the registry does not know, and
// every server-streaming call under WithoutStreamRequestFirst.
func fingerprint(method string, req any) (idempotency.Digest, error) {
	var b []byte
	if m, ok := req.(proto.Message); ok {
		var err error
		if b, err = deterministic.Marshal(m); err != nil {
			return idempotency.Digest{}, err
		}
	}
	return idempotency.Fingerprint(method, b), nil
}

// fingerprint is the package's fingerprint of the request's method and
// request, or, when the request cannot be marshalled, the refusal of the try
// (nothing ran: NOT_ADMITTED REQUEST_TOO_LARGE, final, as admission's is:
// the same request fails the same way on every try).
func (in *inbound) fingerprint(method string, req any) (idempotency.Digest, error) {
	fp, err := fingerprint(method, req)
	if err != nil {
		return fp, status.NotAdmitted(status.ReasonRequestTooLarge, status.WithAttempt(in.s.ID, in.s.Call, in.s.Try),
			status.Final(), status.WithMessage("interceptor: request cannot be marshalled: "+err.Error()))
	}
	return fp, nil
}

// beginTry begins the try in the store. It returns started, or the answer
// the record gives instead (a replayed response, or an error).
//
// An attempt this server minted for the request (s.Origin: the caller sent
// no tollgate header, or is not trusted) is begun as Minted: it cannot have
// had an earlier try anywhere, so the store does not refuse it for lying
// within the skew after its horizon.
func (sv *server) beginTry(ctx context.Context, method string, in *inbound, fp idempotency.Digest, stream bool) (started bool, replay any, err error) {
	answered := false // a finished record answered: no refusal
	defer func() {
		if !started && !answered && err != nil {
			sv.refused(ctx, err)
		}
	}()
	s := in.s
	var res idempotency.BeginResult
	err = sv.storeCall(func() (err error) {
		res, err = sv.cfg.store.Begin(ctx, idempotency.BeginRequest{Key: in.key(method), Try: s.Try, Fingerprint: fp, Deadline: s.Deadline, Minted: s.Origin})
		return err
	})
	if err != nil {
		if errors.Is(err, idempotency.ErrMalformedKey) {
			// The header's fields are validated with the key's own rules,
			// so a malformed key is the server's doing (its method name):
			// nothing ran, and no repeat can help.
			return false, nil, status.NotAdmitted(status.ReasonStoreUnavailable, status.Fields{
				AttemptID: s.ID, Call: s.Call, Try: s.Try, Final: true,
				Message: "interceptor: the server cannot key this call's record: " + err.Error()})
		}
		if ctx.Err() != nil {
			// The try's context ended before the store could begin it (a
			// timeout interceptor chained outside this one cut it, or its
			// client's deadline passed while its request was decoded):
			// the store did not fail, and nothing ran.
			return false, nil, sv.contextEnded(ctx, in)
		}
		if errors.Is(err, idempotency.ErrTooLittleTime) {
			// The store sent nothing: the try's time left cannot fit the
			// store's work (a wait for replicas), as admission refuses a
			// try that cannot fit its service time. Final when no later
			// try could fit either: a repeat's time left (with the skew)
			// is less than the store needs.
			var tl *idempotency.TooLittleTimeError
			final := errors.As(err, &tl) && sv.repeatLeft(in, sv.cfg.now()) < tl.Needed
			return false, nil, status.NotAdmitted(status.ReasonDeadlineUnreachable, status.Fields{
				AttemptID: s.ID, Call: s.Call, Try: s.Try, Final: final, Message: err.Error()})
		}
		return false, nil, status.NotAdmitted(status.ReasonStoreUnavailable, status.Fields{
			AttemptID: s.ID, Call: s.Call, Try: s.Try, RetryAfter: storeRetryAfter/2 + rand.N(storeRetryAfter),
			// The reason says "store unavailable": not the sentinel's words again.
			Message: strings.TrimPrefix(err.Error(), idempotency.ErrStoreUnavailable.Error()+": ")})
	}
	if res.Started {
		if in.expired {
			// The store started a try the server knows is late (clocks
			// disagree by more than the skew): end it as a tombstone, unrun.
			// Its caller may have given up while the store began it, so the
			// tombstone is written on a context of its own (else the record
			// would stay IN_PROGRESS and read ABANDONED, an UNKNOWN for a try
			// that never ran), bounded as every Finish made after the caller
			// may have gone (streamFinishTimeout): a hung store must not hold
			// the goroutine for as long as a caller without deadline waits.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), streamFinishTimeout)
			_ = sv.storeCall(func() error {
				return sv.cfg.store.Finish(fctx, idempotency.FinishRequest{Key: in.key(method), Try: s.Try, Fingerprint: fp,
					State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, Minted: s.Origin})
			})
			cancel()
			return false, nil, sv.lateRefusal(ctx, in)
		}
		return true, nil, nil
	}
	rec := res.Record
	id := status.WithAttempt(s.ID, s.Call, s.Try)
	switch res.Refusal {
	case idempotency.RefusedFinished:
		answered = true
		resp, err := sv.replay(method, rec, stream, id)
		return false, resp, err
	case idempotency.RefusedInProgress:
		var wait time.Duration
		if le := rec.GetLeaseExpiresAt(); le != nil {
			wait = max(le.AsTime().Sub(sv.cfg.now())/8, time.Millisecond)
			wait = wait/2 + rand.N(wait) // jittered, as every retry-after
		}
		return false, nil, status.NotAdmitted(status.ReasonAttemptInProgress, id, status.WithRetryAfter(wait))
	case idempotency.RefusedAbandoned:
		return false, nil, status.OutcomeUnknown(nil, id,
			status.WithMessage("interceptor: an earlier try's lease ran out before it finished"))
	case idempotency.RefusedFenced:
		return false, nil, status.NotAdmitted(status.ReasonAttemptFenced, id, status.WithFencedThroughTry(rec.GetFencedThroughTry()))
	case idempotency.RefusedMismatch:
		return false, nil, status.RequestMismatch(recordOutcome(rec), id)
	case idempotency.RefusedDeadlineExpired:
		// The store's clock says the try came late: a miss on arrival, as
		// the server's own (expired), and final as that is.
		return false, nil, sv.lateRefusal(ctx, in)
	case idempotency.RefusedUnverifiable:
		if !res.VerifiableFrom.IsZero() {
			return false, nil, sv.beforeHorizon(s, id, res.VerifiableFrom)
		}
	}
	// RefusedUnverifiable for another reason, and any refusal this build
	// does not know.
	msg := msgUnverifiable
	if _, ok := idempotency.AttemptTime(s.ID); !ok {
		msg = msgNotV7
	}
	return false, nil, status.OutcomeUnknown(nil, id, status.WithReason(status.ReasonAttemptUnverifiable), status.Final(),
		status.WithMessage(msg))
}

const msgNotV7 = "interceptor: the record store cannot vouch for this attempt's earlier tries: " +
	"its ID is not a UUIDv7, so it carries no creation time to judge by; mint attempt IDs as tollgate's client does"

const msgUnverifiable = "interceptor: the record store cannot vouch for this attempt's earlier tries: " +
	"the attempt was created longer ago than the store keeps records (its TTL, less the clock skew), " +
	"so records of earlier tries may have expired, or its ID's time lies ahead of this server's clock by more than the skew; " +
	"an attempt's recorded calls must be made within the store's TTL, less the clock skew, of its start"

// repeatLeft is the most time, with the skew, that a repeat of in's try
// arriving at now could have: until the attempt's deadline; or, when that
// is the server's cap from this request's arrival (inbound.capped), until
// the cap a repeat would get from now, or the caller's own deadline
// (inbound.own) if that comes first.
func (sv *server) repeatLeft(in *inbound, now time.Time) time.Duration {
	d := in.s.Deadline
	if in.capped {
		d = now.Add(sv.cfg.maxAttemptTime)
		if !in.own.IsZero() && in.own.Before(d) {
			d = in.own
		}
	}
	return d.Add(sv.cfg.skew).Sub(now)
}

// contextEnded is the refusal of a try whose context ended before its
// record was begun: nothing ran. When a deadline ended it (its error or
// cause is context.DeadlineExceeded, or it was canceled once its deadline
// had passed, as a client's RST_STREAM at its deadline can come before the
// server's timer, or the attempt's deadline plus the skew has passed) it is
// DEADLINE_EXPIRED, final only when the attempt's deadline has (see
// tryDeadlineOnly), as admission's refusal of a waiter whose context ended
// is; otherwise (its caller, or an interceptor, canceled it) a NOT_ADMITTED
// that names no reason and is not final, as admission's refusal of a
// cancelled waiter. Neither is STORE_UNAVAILABLE: the store did not fail.
// The first is counted in tollgate.deadline.misses{stage=begin}: the try
// came in time and passed admission, so neither the arrival count nor the
// controller's misses see it; a late try (inbound.expired), which only read
// its record, with stage=arrival, as every late try refused for its
// lateness is (its lookup's permit is given back unrun, so admission does
// not count it again as a run miss). A cancellation of a try that came in
// time is no deadline miss (admission counts a cancelled waiter as
// cancelled), and is not counted there.
func (sv *server) contextEnded(ctx context.Context, in *inbound) error {
	missed, err := sv.endedRefusal(ctx, in, true)
	if missed {
		stage := beginStage
		if in.expired {
			stage = arrivalStage // it came late: no begin miss (see above)
		}
		sv.tel.late.Add(ctx, 1, stage)
		in.missCounted = true
	}
	return err
}

// endedRefusal is contextEnded's refusal of a try whose context ended
// before its record was begun (begun set), or before its request came
// (receiveFirst), uncounted: missed reports whether a deadline ended it,
// which its caller counts in tollgate.deadline.misses.
func (sv *server) endedRefusal(ctx context.Context, in *inbound, begun bool) (missed bool, err error) {
	s := in.s
	now := sv.cfg.now()
	dl, hasDeadline := ctx.Deadline()
	id := status.WithAttempt(s.ID, s.Call, s.Try)
	byOwn := errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(context.Cause(ctx), context.DeadlineExceeded) ||
		(hasDeadline && !time.Now().Before(dl))
	if byOwn || !now.Before(s.Deadline.Add(sv.cfg.skew)) {
		if !hasDeadline || !byOwn {
			// The attempt's deadline plus the skew ended it, not the
			// context's own, which has not come: the try's deadline
			// passed by now (the attempt's is final only when it is not
			// the server's cap, see tryDeadlineOnly).
			dl = now
		}
		msg := "interceptor: the try's context ended, by its deadline, before its record was begun"
		if !begun {
			msg = "interceptor: the try's context ended, by its deadline, before its request came"
		}
		err := status.NotAdmitted(status.ReasonDeadlineExpired, status.Fields{Final: true, Message: msg})
		return true, status.With(sv.tryDeadlineOnly(err, in, dl), id)
	}
	msg := "interceptor: the try's context was canceled before its record was begun"
	if !begun {
		msg = "interceptor: the try's context was canceled before its request came"
	}
	return false, status.NotAdmitted(status.ReasonUnspecified, status.Fields{AttemptID: s.ID, Call: s.Call, Try: s.Try,
		Message: msg})
}

// beforeHorizon is the refusal of a try of a caller's attempt created before
// verifiableFrom, its store's horizon plus the clock skew: the store began
// retaining too recently to vouch that no earlier try ran. It is UNKNOWN,
// final, as any unverifiable try. The first try of a numbered key also
// carries, as its retry-after, the time until an attempt newly created by
// any trusted peer would be verifiable — verifiableFrom plus the skew, as
// the peer's clock may lag this server's by that much — jittered up to
// half again; the caller's owner passes it on when it ends the call
// NOT_ADMITTED (nobody else can have sent its first try). Any other try
// carries none: a later try's earlier tries, and an explicit key's other
// runs, may have run, and a new attempt is not simply their repeat.
func (sv *server) beforeHorizon(s *attemptState, id status.Option, verifiableFrom time.Time) error {
	var wait time.Duration
	if s.Try == 1 && !callkey.Explicit(s.Call) {
		// Capped, so that the jitter cannot wrap a horizon centuries ahead
		// (Sub saturates at the longest Duration) into a negative wait.
		wait = min(max(verifiableFrom.Add(sv.cfg.skew).Sub(sv.cfg.now()), 0), math.MaxInt64/2)
		if wait > 0 {
			wait += rand.N(wait/2 + 1) // jittered upwards: never before it can pass, not all at once
		}
	}
	return status.OutcomeUnknown(nil, id, status.WithReason(status.ReasonAttemptUnverifiable), status.Final(),
		status.WithRetryAfter(wait), status.WithMessage(msgBeforeHorizon))
}

const msgBeforeHorizon = "interceptor: the store began retaining records (a restart, failover or flush, " +
	"a Redis tenant's first request or idle expiry, a clock stepped forward in memory) less than the clock skew before this attempt " +
	"was created, or later: it cannot vouch that no earlier try ran; a later attempt can be verified"

// storeRetryAfter is the mean delay suggested when the store cannot begin a
// try; each refusal draws one in [½, 1½) of it, so refused clients do not
// return in step.
const storeRetryAfter = 100 * time.Millisecond

// replay answers a try from a finished record: a SUCCEEDED unary record's
// response, COMMITTED when the response is not available, the definite error
// of a FAILED record (bounded by status.Bounded, as the fresh one was),
// UNKNOWN for an UNKNOWN one (its message and details bounded as every
// outcome's).
func (sv *server) replay(method string, rec *tollgatev1.AttemptRecord, stream bool, id status.Option) (any, error) {
	switch rec.GetState() {
	case tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED:
		if !stream && rec.GetResponseRetained() {
			if resp, err := idempotency.DecodeResponse(method, rec.GetResponse()); err == nil {
				return resp, nil
			}
			if resp, ok := sv.replies.decode(method, rec.GetResponse()); ok {
				return resp, nil
			}
		}
		return nil, status.Committed(id)
	case tollgatev1.AttemptState_ATTEMPT_STATE_FAILED:
		// Bounded as a handler's fresh definite error is (answer): the
		// record may come from a build that did not bound it, or from the
		// store's own writer, and a caller with an 8 KiB header list limit
		// must not lose it to a transport INTERNAL on every later try.
		return nil, status.Bounded(recordError(rec))
	default:
		// With the details the record kept: the answer to every try is the
		// same (OutcomeUnknown drops the cause's own tollgate details).
		return nil, status.OutcomeUnknown(grpcstatus.ErrorProto(&spb.Status{
			Code: int32(unknownRecordCode(rec)), Message: rec.GetStatusMessage(), Details: rec.GetStatusDetails()}), id)
	}
}

func unknownRecordCode(rec *tollgatev1.AttemptRecord) codes.Code {
	if c := codes.Code(rec.GetStatusCode()); c != codes.OK {
		return c
	}
	return codes.Unknown
}

// recordOutcome is what a record says of its own effect, for a mismatch's
// detail: COMMITTED for a success, NOT_ADMITTED for a tombstone, UNKNOWN
// otherwise (a running, abandoned or unknown try, or a definite failure whose
// effect the record does not vouch for).
func recordOutcome(rec *tollgatev1.AttemptRecord) tollgatev1.Outcome {
	switch rec.GetState() {
	case tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED:
		return tollgatev1.Outcome_OUTCOME_COMMITTED
	case tollgatev1.AttemptState_ATTEMPT_STATE_FENCED:
		return tollgatev1.Outcome_OUTCOME_NOT_ADMITTED
	default:
		return tollgatev1.Outcome_OUTCOME_UNKNOWN
	}
}

// finishTry records how the handler's run ended (DESIGN.md §3.7), by the
// answer the server is about to send. If the record cannot be finished, the
// caller gets UNKNOWN, never success.
func (sv *server) finishTry(ctx context.Context, method string, in *inbound, fp idempotency.Digest, resp any, answer error, spent int64, stream bool) error {
	s := in.s
	req := idempotency.FinishRequest{Key: in.key(method), Try: s.Try, Fingerprint: fp, UnitsSpent: spent, Minted: s.Origin}
	o := status.OutcomeOf(answer)
	switch o.Kind {
	case status.KindOK:
		req.State = tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED
		req.Withheld = true // unless the response serializes, below
		if m, ok := resp.(proto.Message); ok && !stream {
			if b, err := deterministic.Marshal(m); err == nil {
				req.Response, req.Withheld = b, false
				sv.replies.learn(method, m)
			}
		}
	case status.KindFailed:
		req.State = tollgatev1.AttemptState_ATTEMPT_STATE_FAILED
	case status.KindNotAdmitted:
		req.State = tollgatev1.AttemptState_ATTEMPT_STATE_FENCED
	default:
		req.State = tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN
	}
	if answer != nil {
		st := grpcstatus.Convert(answer).Proto()
		req.Code, req.Message, req.Details = codes.Code(st.GetCode()), st.GetMessage(), st.GetDetails()
	}
	// ctx is the handler's detached context: the client may be long gone
	// and the record must still be finished, but not after the try's lease
	// (d + skew) ran out, when the store could no longer accept it anyway.
	if err := sv.storeCall(func() error { return sv.cfg.store.Finish(ctx, req) }); err != nil {
		why := "interceptor: the try's record could not be finished: " + err.Error()
		if !sv.cfg.now().Before(s.Deadline.Add(sv.cfg.skew)) {
			// The handler ran until its deadline, which is the lease's end:
			// the store no longer takes the record's end, and the record
			// reads ABANDONED. An expected ending, told in the call's words,
			// not the store's.
			why = msgLeaseEnded
		}
		return status.OutcomeUnknown(answer, status.WithAttempt(s.ID, s.Call, s.Try), status.WithMessage(why))
	}
	return answer
}

const msgLeaseEnded = "interceptor: the handler ran until its try's lease ended (the attempt's deadline plus the clock skew), " +
	"so its record could not be finished: it reads ABANDONED, and its effect is unknown"

// storeCall runs f, a call of the attempt store on the data path. On a
// server that opted into recovery (WithRecovery) a panic in it is recovered
// into an error wrapping idempotency.ErrStoreUnavailable, as the control
// path recovers the AttemptService's, whose handler calls the same Store: a
// Begin that panicked is refused NOT_ADMITTED STORE_UNAVAILABLE (the
// handler did not run), a Finish that panicked answers UNKNOWN (beginTry,
// finishTry), each naming the try, with tollgate-spent. Without recovery
// the panic goes on.
func (sv *server) storeCall(f func() error) (err error) {
	if sv.cfg.recoverPanics {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%w: interceptor: the attempt store panicked: %v", idempotency.ErrStoreUnavailable, r)
			}
		}()
	}
	return f()
}

// detach returns the context a recorded try's handler runs on: detached from
// the client's cancellation, with deadline exactly d + skew (DESIGN.md §3.1),
// so that a slow state-changing try finishes and its record resolves.
func (sv *server) detach(ctx context.Context, in *inbound) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.WithoutCancel(ctx), in.s.Deadline.Add(sv.cfg.skew))
}

// preReceived is the stream a server-streaming handler gets when the stream
// interceptor received the call's one request before the handler chain ran
// (server.stream: a recorded call, or one under admission): its first RecvMsg hands that request over, and
// later ones receive from the client's stream, where grpc-go answers io.EOF
// (the client sends one message). Handing over copies the request into m,
// the request's own message in any Go form grpc-go's codec takes
// (handOver); any other m gets INTERNAL, and the request is handed over to
// no later call.
//
// RecvMsg is called by one goroutine at a time, as grpc-go requires of a
// stream, and SendMsg does not touch req, so req needs no lock.
type preReceived struct {
	serverStream
	req proto.Message // nil once handed over
}

func (s *preReceived) RecvMsg(m any) error {
	req := s.req
	if req == nil {
		return s.ServerStream.RecvMsg(m)
	}
	s.req = nil
	return handOver(req, m)
}

// handOver copies req, the request tollgate received, into m, the message
// the handler receives it into: by merging when both are the same generated
// type, and through its wire form when m is the same message in another Go
// form (an APIv1 message, which grpc-go's codec accepts as well, or a
// dynamic one). A message of another name gets INTERNAL: the client's bytes
// were decoded as the registry's type, and reading that decoding as another
// message would not give what grpc-go decodes from the bytes themselves
// (repeated fields, wider integers, presence, invalid UTF-8); such a server
// passes WithoutStreamRequestFirst. So does a nil or otherwise unusable m.
func handOver(req proto.Message, m any) error {
	var dst proto.Message
	switch v := m.(type) {
	case proto.Message:
		dst = v
	case protoadapt.MessageV1:
		dst = protoadapt.MessageV2Of(v)
	}
	want := req.ProtoReflect().Descriptor()
	if dst == nil || !dst.ProtoReflect().IsValid() || dst.ProtoReflect().Descriptor().FullName() != want.FullName() {
		return grpcstatus.Errorf(codes.Internal, "interceptor: the handler receives its request into a %T (not a usable %s), but tollgate received it before the handler ran, as a %s; a server whose handlers do so passes interceptor.WithoutStreamRequestFirst",
			m, want.FullName(), want.FullName())
	}
	proto.Reset(dst)
	if dst.ProtoReflect().Descriptor() == want {
		proto.Merge(dst, req)
		return nil
	}
	b, err := proto.Marshal(req)
	if err == nil {
		err = proto.Unmarshal(b, dst)
	}
	if err != nil {
		return grpcstatus.Errorf(codes.Internal, "interceptor: handing the request over to the handler's %T: %v", m, err)
	}
	return nil
}

// responseTypes maps a method the protobuf registry does not know to the
// message type of the responses its handler returned here. A record's
// response of such a method is replayed as that type, which the server's
// handlers have shown it to be, instead of answering COMMITTED,
// RESPONSE_NOT_RETAINED. It holds at most maxResponseTypes methods (a
// server that serves unknown methods through an UnknownServiceHandler may
// see any number of names); a method not yet learned here (no call of it
// has succeeded on this server since it started, whichever replica wrote
// the record) still answers COMMITTED. Safe for concurrent use; its zero
// value is empty.
type responseTypes struct {
	m sync.Map // method → protoreflect.MessageType, or inRegistry
	n atomic.Int32
}

// inRegistry marks a method the protobuf registry knows: nothing to learn.
type inRegistry struct{}

const maxResponseTypes = 1024

// learn remembers m's type as method's response type, when the registry
// does not know the method. After a method's first success it costs one
// map read.
func (r *responseTypes) learn(method string, m proto.Message) {
	if _, ok := r.m.Load(method); ok || r.n.Load() >= maxResponseTypes {
		return
	}
	var v any = inRegistry{}
	if _, err := idempotency.ResponseType(method); err != nil {
		v = m.ProtoReflect().Type()
	}
	if _, loaded := r.m.LoadOrStore(method, v); !loaded {
		r.n.Add(1)
	}
}

// decode unmarshals b as method's learned response type.
func (r *responseTypes) decode(method string, b []byte) (proto.Message, bool) {
	v, _ := r.m.Load(method)
	mt, ok := v.(protoreflect.MessageType)
	if !ok {
		return nil, false
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, false
	}
	return m, true
}

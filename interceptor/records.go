package interceptor

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/internal/methodinfo"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
// unary call's request, and of a server-streaming call's one request when
// its handler receives it (recordedStream). A request that is not a proto
// message is fingerprinted by its method alone, as are client-streaming and
// bidi streams, whose requests arrive while the handler runs.
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

// beginTry begins the try in the store. It returns started, or the answer
// the record gives instead (a replayed response, or an error).
func (sv *server) beginTry(ctx context.Context, method string, in *inbound, fp idempotency.Digest, stream bool) (started bool, replay any, err error) {
	s := in.s
	res, err := sv.cfg.store.Begin(ctx, idempotency.BeginRequest{Key: in.key(method), Try: s.Try, Fingerprint: fp, Deadline: s.Deadline})
	if err != nil {
		if errors.Is(err, idempotency.ErrMalformedKey) {
			// The header's fields are validated with the key's own rules,
			// so a malformed key is the server's doing (its method name):
			// nothing ran, and no repeat can help.
			return false, nil, status.NotAdmitted(status.ReasonStoreUnavailable, status.Fields{
				AttemptID: s.ID, Call: s.Call, Try: s.Try, Final: true,
				Message: "interceptor: the server cannot key this call's record: " + err.Error()})
		}
		return false, nil, status.NotAdmitted(status.ReasonStoreUnavailable, status.Fields{
			AttemptID: s.ID, Call: s.Call, Try: s.Try, RetryAfter: storeRetryAfter/2 + rand.N(storeRetryAfter), Message: err.Error()})
	}
	if res.Started {
		if in.expired {
			// The store started a try the server knows is late (clocks
			// disagree by more than the skew): end it as a tombstone, unrun.
			_ = sv.cfg.store.Finish(ctx, idempotency.FinishRequest{Key: in.key(method), Try: s.Try, Fingerprint: fp,
				State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED})
			return false, nil, expired(s)
		}
		return true, nil, nil
	}
	rec := res.Record
	id := status.WithAttempt(s.ID, s.Call, s.Try)
	switch res.Refusal {
	case idempotency.RefusedFinished:
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
		return false, nil, status.NotAdmitted(status.ReasonDeadlineExpired, id, status.Final())
	default: // RefusedUnverifiable, and any refusal this build does not know
		return false, nil, status.OutcomeUnknown(nil, id, status.WithReason(status.ReasonAttemptUnverifiable), status.Final(),
			status.WithMessage("interceptor: the record store cannot vouch for this attempt's earlier tries"))
	}
}

// storeRetryAfter is the mean delay suggested when the store cannot begin a
// try; each refusal draws one in [½, 1½) of it, so refused clients do not
// return in step.
const storeRetryAfter = 100 * time.Millisecond

// replay answers a try from a finished record: a SUCCEEDED unary record's
// response, COMMITTED when the response is not available, the definite error
// of a FAILED record, UNKNOWN for an UNKNOWN one.
func (sv *server) replay(method string, rec *tollgatev1.AttemptRecord, stream bool, id status.Option) (any, error) {
	switch rec.GetState() {
	case tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED:
		if !stream && rec.GetResponseRetained() {
			if resp, err := idempotency.DecodeResponse(method, rec.GetResponse()); err == nil {
				return resp, nil
			}
		}
		return nil, status.Committed(id)
	case tollgatev1.AttemptState_ATTEMPT_STATE_FAILED:
		return nil, recordError(rec)
	default:
		return nil, status.OutcomeUnknown(grpcstatus.ErrorProto(&spb.Status{
			Code: int32(unknownRecordCode(rec)), Message: rec.GetStatusMessage()}), id)
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
	req := idempotency.FinishRequest{Key: in.key(method), Try: s.Try, Fingerprint: fp, UnitsSpent: spent}
	o := status.OutcomeOf(answer)
	switch o.Kind {
	case status.KindOK:
		req.State = tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED
		req.Withheld = true // unless the response serializes, below
		if m, ok := resp.(proto.Message); ok && !stream {
			if b, err := deterministic.Marshal(m); err == nil {
				req.Response, req.Withheld = b, false
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
	if err := sv.cfg.store.Finish(ctx, req); err != nil {
		return status.OutcomeUnknown(answer, status.WithAttempt(s.ID, s.Call, s.Try),
			status.WithMessage("interceptor: the try's record could not be finished: "+err.Error()))
	}
	return answer
}

// detach returns the context a recorded try's handler runs on: detached from
// the client's cancellation, with deadline exactly d + skew (DESIGN.md §3.1),
// so that a slow state-changing try finishes and its record resolves.
func (sv *server) detach(ctx context.Context, in *inbound) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.WithoutCancel(ctx), in.s.Deadline.Add(sv.cfg.skew))
}

// recordedStream is the stream a recorded server-streaming handler gets. Its
// one request arrives after the handler starts, so the try is begun at the
// handler's first RecvMsg, with the fingerprint of (method, request): the same
// call key with another request is refused ATTEMPT_REQUEST_MISMATCH
// (DESIGN.md §2.2). grpc-go's generated handler receives the request before
// it calls the method, so the method runs only once the store started the
// try; when the store answers instead (a finished record, a try in progress,
// a tombstone, a mismatch, the store unavailable), RecvMsg returns that answer,
// the generated handler returns it without calling the method, and no record
// is finished for it.
//
// A hand-written handler that sends a message before it received its
// request, or returns without receiving it, acted before its record could be
// begun: its SendMsg sends nothing and fails, a later RecvMsg fails too, and
// the try ends UNKNOWN, final (escapedRun), recorded so where the store still
// lets it begin. A handler whose first receive fails (no request came) never
// got to the method and keeps no record.
//
// RecvMsg is called by one goroutine at a time, as grpc-go requires, and may
// run beside one calling SendMsg; end is called after the handler returned.
type recordedStream struct {
	serverStream
	sv     *server
	in     *inbound
	ctx    context.Context // the stream's own context, on which the try is begun
	method string
	// state is the phase and the escaped bit. The phase leaves phaseIdle once,
	// in RecvMsg, after fp or refusal is written; SendMsg may set escaped.
	state   atomic.Uint32
	fp      idempotency.Digest // of the begun try (phaseBegun)
	refusal error              // the store's answer instead of a start (phaseRefused)
}

const (
	phaseIdle    = iota // the request is not received yet
	phaseBegun          // received, and the store started the try
	phaseRefused        // received, and the store answered instead
	phaseLost           // the first receive failed: no request, no record
	phaseMask    = 3
	escapedBit   = 4 // the handler sent before the try was begun
)

// RecvMsg receives the request and begins the try with its fingerprint, or
// returns the store's answer instead.
func (rs *recordedStream) RecvMsg(m any) error {
	switch st := rs.state.Load(); {
	case st&phaseMask == phaseBegun || st&phaseMask == phaseLost:
		return rs.ServerStream.RecvMsg(m)
	case st&phaseMask == phaseRefused:
		return rs.refusal
	case st&escapedBit != 0:
		return escapedRun(rs.in.s) // it acted first: the request is not read outside a record
	}
	if err := rs.ServerStream.RecvMsg(m); err != nil {
		rs.state.Add(phaseLost)
		return err
	}
	s := rs.in.s
	fp, err := fingerprint(rs.method, m)
	started := false
	if err != nil {
		err = status.NotAdmitted(status.ReasonRequestTooLarge, status.WithAttempt(s.ID, s.Call, s.Try),
			status.WithMessage("interceptor: request cannot be marshalled: "+err.Error()))
	} else {
		started, _, err = rs.sv.beginTry(rs.ctx, rs.method, rs.in, fp, true)
	}
	if started {
		rs.fp = fp
		rs.state.Add(phaseBegun)
		return nil
	}
	// The method does not run: nothing may be spent for it.
	s.ledger.Seal()
	rs.refusal = err
	rs.state.Add(phaseRefused)
	return err
}

// SendMsg sends m once the try is begun, and otherwise refuses to.
func (rs *recordedStream) SendMsg(m any) error {
	if rs.state.Load()&phaseMask != phaseBegun {
		// Marked escaped unless RecvMsg began the try meanwhile (then the
		// mark is moot: end looks at a begun try's phase alone).
		if old := rs.state.Or(escapedBit); old&phaseMask != phaseBegun {
			return escapedRun(rs.in.s)
		}
	}
	return rs.ServerStream.SendMsg(m)
}

// end returns, once the handler returned with answer, whether the try has a
// record to finish (and its fingerprint) and the answer to send: the
// handler's for a begun try, the store's for a refused one (no record of its
// own), the handler's for a try whose request never came (no record), and
// UNKNOWN, final, for a handler that acted before its try was begun. Such a
// try is begun then, with the fingerprint of the method alone, so that the
// store does not read the run as absent; it is finished UNKNOWN.
func (rs *recordedStream) end(answer error) (recorded bool, fp idempotency.Digest, _ error) {
	st := rs.state.Load()
	switch {
	case st&phaseMask == phaseBegun:
		return true, rs.fp, answer
	case st&escapedBit == 0 && st&phaseMask == phaseRefused:
		return false, fp, rs.refusal
	case st&escapedBit == 0 && st&phaseMask == phaseLost:
		return false, fp, answer
	}
	fp = idempotency.Fingerprint(rs.method, nil)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rs.ctx), streamFinishTimeout)
	defer cancel()
	started, _, _ := rs.sv.beginTry(ctx, rs.method, rs.in, fp, true)
	return started, fp, escapedRun(rs.in.s)
}

// escapedRun is the answer of a recorded server-streaming try whose handler
// sent before it received its request, or returned without receiving it: it
// ran before its record could be begun, so what it did is unknown, and no
// query or repeat can tell (final). grpc-go's generated handlers never do
// this.
func escapedRun(s *attemptState) error {
	return status.OutcomeUnknown(nil, status.WithAttempt(s.ID, s.Call, s.Try), status.WithCode(codes.Internal), status.Final(),
		status.WithMessage("interceptor: a recorded server-streaming handler must receive its request before it sends or returns"))
}

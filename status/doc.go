// Package status builds and reads tollgate's typed outcomes: errors that tell a
// caller not only that a call failed, but what it may conclude about the
// call's effect.
//
// Every tollgate refusal or unresolved outcome is a gRPC status that carries a
// tollgate.v1.OutcomeDetail, a google.rpc.ErrorInfo (domain "tollgate.dev",
// reason = the Reason's name without its REASON_ prefix) and, when a
// NOT_ADMITTED refusal suggests a delay, a google.rpc.RetryInfo (an UNKNOWN or
// COMMITTED outcome, or a mismatch, keeps a suggested delay in the detail's
// retry_after alone: a RetryInfo would invite a generic client to repeat it).
// The detail is authoritative; the code is chosen so that generic gRPC
// clients behave well:
//
//	outcome       meaning                                   code
//	NOT_ADMITTED  no effect at this tier or below           RESOURCE_EXHAUSTED (overload, limits,
//	                                                        allowance, fences) or UNAVAILABLE
//	                                                        (draining, store unavailable, not sent,
//	                                                        attempt unverifiable)
//	UNKNOWN       the effect may or may not have happened   the underlying code, but never
//	                                                        UNAVAILABLE or RESOURCE_EXHAUSTED
//	                                                        (those become UNKNOWN)
//	COMMITTED     the effect happened, the response is      FAILED_PRECONDITION,
//	              not available                             reason RESPONSE_NOT_RETAINED, final
//	(mismatch)    same call key, different request         INVALID_ARGUMENT, final
//	(malformed)   bad tollgate header or call key          INVALID_ARGUMENT, final
//
// A malformed header (MALFORMED_HEADER) and a missing explicit call key
// (CALL_KEY_REQUIRED) are NOT_ADMITTED refusals sent as INVALID_ARGUMENT. A
// mismatch's detail carries what the existing record says of its own effect;
// [OutcomeOf] reads it as [KindFailed], a definite error for this request.
//
// Build them with [NotAdmitted], [OutcomeUnknown], [Committed] and
// [RequestMismatch]; read any error back with [OutcomeOf], which returns an
// [Outcome]: its [Kind], [Reason], gRPC code and detail. [RetryAfter] reads
// the suggested delay, [IsFinal] the final flag, and [Pushback] and
// [SetPushbackTrailer] give clients that use grpc-go's own retry the
// grpc-retry-pushback-ms trailer ("-1", do not retry, for a final
// refusal that suggests no delay).
//
// Building a refusal costs one allocation; its gRPC status is built once, on
// the first GRPCStatus call, with a few more (most of them grpc-go's copy of
// the status). Every function here is safe for concurrent use, and reading
// never panics, whatever bytes a peer sent.
//
// # Reading an error
//
// [OutcomeOf] classifies an error that a caller holds, in this order:
//
//  1. nil is [KindOK].
//  2. A tollgate detail decides: its outcome is the Kind. It is read from
//     the error that decides the gRPC status, the first in the %w chain with
//     a GRPCStatus method, as grpc/status.FromError finds it (a *[Error], or
//     a status received from a peer). A request mismatch is [KindFailed] (the
//     request was refused and ran nothing under that key; the detail's
//     outcome tells what the existing record says); an outcome this build
//     does not know is [KindUnknown]. Detail bytes that do not decode are
//     ignored. The detail's strings are bounded as the tollgate header
//     bounds them (DESIGN.md §2.1), whatever a peer sent, so that a
//     hostile or broken peer's megabyte string is neither copied by every
//     reading nor put on a span: an attempt ID over 64 bytes and a call
//     key over 128 read as "…" (no identifier, and equal to none, as the
//     long string was), a class over 256 bytes as "". [Fields] bounds an
//     outcome's own the same way, so it reads the same on both sides of
//     the wire.
//  3. context.Canceled and context.DeadlineExceeded are [KindUnknown]:
//     the caller stopped waiting, it does not know what happened.
//  4. Otherwise the gRPC code decides: the definite codes INVALID_ARGUMENT,
//     NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, FAILED_PRECONDITION,
//     OUT_OF_RANGE, UNIMPLEMENTED and UNAUTHENTICATED are [KindFailed];
//     every other code (and an error that is not a gRPC status, which is
//     UNKNOWN) is [KindUnknown].
//
// A client knows more than the error: whether the request left it at all.
// [OutcomeOfCall] takes that knowledge ([Delivery]) and applies the contract's
// table (DESIGN.md §2.5) for errors without a tollgate detail, except that a
// try never sent whose error has a definite code is that definite error, not
// NOT_SENT:
//
//	delivery          code                  outcome
//	NotSent           definite (as above)   FAILED (that definite error)
//	NotSent           any other             NOT_ADMITTED, reason NOT_SENT
//	PeerStatus        definite (as above)   FAILED (that definite error)
//	PeerStatus        any other             UNKNOWN
//	MaybeSent         any                   UNKNOWN, reason CALL_LOST
//
// A definite code stays definite only when the peer's status arrived, or
// when nothing left the client: then it is the client's own failure
// (credentials refused UNAUTHENTICATED, an inner interceptor's
// INVALID_ARGUMENT), which no repeat mends. After the request may have been
// sent, a client-side NOT_FOUND, say, proves nothing about the server.
//
// # Classifying a handler's result
//
// A server records what its handler's error means for the call it served with
// [HandlerOutcome], by tollgate detail before code: a NOT_ADMITTED detail stays
// NOT_ADMITTED only when the handler declared it with [WithoutEffect] or the
// method is declared NO_SIDE_EFFECTS (an IDEMPOTENT method has effects, so it
// does not qualify); any other NOT_ADMITTED, and any UNKNOWN, COMMITTED or
// mismatch detail that came from below, is UNKNOWN, because the handler ran
// and an effect may have happened here or below. An error without a detail
// goes by code: definite codes are FAILED, everything else UNKNOWN.
//
//	handler's error                                  outcome
//	NOT_ADMITTED detail, WithoutEffect               NOT_ADMITTED
//	NOT_ADMITTED detail, method NO_SIDE_EFFECTS      NOT_ADMITTED
//	other NOT_ADMITTED, UNKNOWN, COMMITTED, mismatch UNKNOWN
//	no detail, definite code                         FAILED
//	no detail, any other code or a context error     UNKNOWN
//
// # Details of another error
//
// An outcome rebuilt from another error (an unknown outcome's cause, or the
// error given to [WithDetailsOf]: a peer's or a handler's status that a
// client or server re-addresses, retypes or makes final) keeps what that
// error's status said: its details follow tollgate's own, in their order,
// but for these, since the rebuilt outcome is authoritative:
//
//   - a tollgate OutcomeDetail is dropped: it describes a call below, or an
//     earlier reading of this one, and would contradict the new detail;
//   - every google.rpc.RetryInfo is dropped: a status carries at most one,
//     tollgate's, made from its own retry_after. Two would be read
//     differently by different readers ([RetryAfter] and most clients take
//     the first, a loop that keeps the last one seen takes the last; grpc-go
//     reads none, only the grpc-retry-pushback-ms trailer), and on an unknown
//     or final outcome any RetryInfo would invite a generic client to
//     repeat. A client or server that rebuilds a refusal that may be
//     repeated, and suggests no delay of its own, may take the delay
//     [RetryAfter] reads from the other error into its retry_after (the
//     interceptor bounds and jitters it; a final refusal keeps only its own
//     detail's: a delay another layer suggested would invite a repeat that
//     cannot help);
//   - a google.rpc.ErrorInfo is not kept as one: a status carries one
//     (AIP-193), tollgate's, with domain "tollgate.dev" and the tollgate
//     reason. Another domain's ErrorInfo has its domain and reason go into
//     the metadata of tollgate's as "cause_domain" and "cause_reason", and
//     each of its metadata entries as "cause_md_" and its key (an entry
//     whose key so made would break AIP-193's rule for metadata keys,
//     [a-z][a-zA-Z0-9-_]+ and at most 64 characters, is dropped); a tollgate
//     ErrorInfo has its cause_ entries (its own cause, from further below)
//     kept as they are, so that a callee's ErrorInfo survives every hop.
//     The first ErrorInfo that gives entries so gives them all; the others,
//     and an ErrorInfo that does not decode, are dropped;
//   - what is carried is bounded, since it goes on up every hop in the
//     grpc-status-details-bin trailer, and a caller whose header list limit
//     is below the peer's (grpc-java's and gRPC C++'s default is 8 KiB) would
//     lose the whole answer as an INTERNAL error: the details kept weigh at
//     most 3 KiB (each counted as it is sent in the status: its encoded Any
//     with the protobuf framing around it, so many tiny details do not
//     escape the bound), a detail that does not fit in
//     what remains is dropped and later ones that fit are kept; the cause_
//     entries weigh at most 512 bytes (key and value), the domain and reason
//     first, then the metadata entries in the order of their keys, each kept
//     while it fits, so that every hop keeps the same ones.
//
// # Messages
//
// The message of an outcome built here is at most 1 KiB as grpc-message
// sends it (gRPC percent-encodes each byte outside printable ASCII, and '%',
// as three). tollgate puts another error's message in its own (an unknown
// outcome's "tollgate: outcome unknown: " and its cause's text, a refusal a
// server re-addresses, a spent retry budget's last try), and the message
// goes on the wire twice, as grpc-message and inside
// grpc-status-details-bin: without a bound, a long message from a handler
// or a peer, or one that grows at every hop, would push the answer past a
// caller's header list limit (8 KiB by default in grpc-java and gRPC C++),
// which loses it as an INTERNAL error (the bound of carried details above
// guards against the same for details). A longer message keeps its start and its end, whole runes,
// joined by "…": the start says what tollgate concluded, the end what was
// added last. A message within the bound is unchanged. A definite error a
// handler returns, which tollgate's server passes up as it is and keeps in
// its call's record, is bounded by [Bounded]: its message as above, and its
// details to 3 KiB (counted as carried details are; a tollgate
// OutcomeDetail, which OutcomeOf reads first, and the RetryInfo whose delay
// RetryAfter reads are kept before any other, so the bound never changes
// what the error reads as or the delay it suggests; a RetryInfo that
// carries more is kept by its delay, and an OutcomeDetail that leaves it no
// room by what it says; then the ErrorInfo an outcome rebuilt from the
// error takes its cause_ entries from, so that they survive the bound,
// one too large for what those leave kept by the entries it gives, and,
// when even that does not fit, no later ErrorInfo kept to be read in its
// place), so that it reaches a
// caller with an 8 KiB header list limit and a record's query answer fits
// what an owner receives. The server bounds a definite error it replays
// from a record the same way, whatever wrote the record.
//
// # Compatibility
//
// Errors built here satisfy GRPCStatus, so grpc-go sends them as they are, and
// [OutcomeOf] finds them through %w wrapping (including grpc-go's own "max
// retries exhausted" wrapping), errors.As and grpc/status.FromError.
package status

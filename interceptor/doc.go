// Package interceptor wires tollgate onto gRPC: client and server
// interceptors that carry one attempt — one identity, one deadline and one
// shared downstream-call allowance — across every try and every tier, and
// make tollgate's client interceptor the one owner that may repeat a call.
//
// # Servers
//
//	srv := grpc.NewServer(interceptor.ServerOptions(
//		interceptor.WithTrustedPeer(interceptor.TrustLoopback), // whose headers to honour
//		interceptor.WithAdmission(ctrl),                         // *admission.Controller (optional)
//	)...)
//
// For each request the server interceptor reads the tollgate header. From a
// trusted peer (WithTrustedPeer) the attempt, deadline, granted units and
// tenant are honoured, units and deadline capped at the server's maxima
// (WithMaxAllowance, WithMaxAttemptTime), and a malformed header is refused
// with INVALID_ARGUMENT, MALFORMED_HEADER, final. From an untrusted peer, or
// without a header, the request starts a new attempt here under the server's
// defaults (WithDefaultAllowance, WithMaxAttemptTime, WithTenant); a
// malformed header is counted (tollgate.metadata.malformed) and ignored. A
// try whose attempt deadline (plus WithClockSkew) has passed is refused,
// DEADLINE_EXPIRED, and counted in tollgate.deadline.misses{stage=arrival}
// — unless the call keeps records and a record answers it (a finished record
// answers every later try, even a late one). The handler
// runs with a deadline of min(grpc-timeout, attempt deadline + skew) — except
// a recorded unary call (WithAttemptStore, a method not declared
// NO_SIDE_EFFECTS), whose handler runs on a context detached from the
// client's cancellation with deadline exactly the attempt deadline + skew, so
// that a try the client stopped waiting for finishes and its record resolves
// — its context carrying the attempt (AttemptFromContext) and this tier's
// ledger (budget.FromContext). When the handler returns the ledger is sealed
// and the units spent below this server are reported in the tollgate-spent
// trailer: when positive; always when the caller asked for strict
// accounting; on every UNKNOWN answer to a trusted caller, whatever its
// code, 0 or not, so that a lenient caller's grant comes back after such an
// answer rather than being held until a record reconciles it; and as 0 on
// every answer to an untrusted caller that sent a tollgate header,
// well-formed or not, since none of its grant was used here (a refusal by
// the admission tap, made before the interceptor runs, carries no trailer:
// see AdmissionTap). Other answers
// to a trusted caller carry it only when positive: the caller settles OK
// answers and definite errors by their code, and a refusal by its detail,
// which names the try (a refusal relayed from further down by a server that
// does not speak tollgate names another attempt, and comes without it).
// Streams are handled alike, except that a stream's handler is
// never detached: it talks to its client, so it keeps the client's
// cancellation and the min deadline even when the stream is recorded (its
// record is finished all the same); its trailer is set when the handler
// returns. With a record store, a try is
// begun before its handler runs and before every interceptor chained inside
// tollgate's, for streams as for unary calls, so none of them runs for a try
// the store refuses. A server-streaming call of a method whose request type
// the protobuf registry knows (generated code registers it) is received by
// the interceptor first, before admission (a client that opens the stream
// and sends nothing holds no slot) when the call is recorded or the server
// has admission, unless WithoutStreamRequestFirst: its one request
// is fingerprinted with the method when recorded, so that its call key
// reused with another request is refused ATTEMPT_REQUEST_MISMATCH, and the
// handler's first RecvMsg gets a copy of it (a later one io.EOF, as from
// grpc-go). A call whose request never comes
// ends with the receive's error, runs nothing and keeps no record; the
// interceptor waits for it no longer than the handler would run (the
// attempt's deadline plus the skew), even without the admission tap or a
// grpc-timeout, and a request that has not come by then is counted in
// tollgate.deadline.misses{stage=arrival}: where the stream's own deadline
// ended the wait (the admission tap's bound, or a grpc-timeout), grpc-go
// answers the failed receive itself, DEADLINE_EXCEEDED; otherwise it is
// answered as one that came after that deadline, or DEADLINE_EXCEEDED where
// only its record could answer it. A wait that the context a stats
// handler's TagRPC or an interceptor chained outside tollgate's gave the
// RPC ended, by a deadline or a cancellation (which grpc-go's receive does
// not watch), is refused as a try whose context ended before its record
// was begun; without the admission tap's bound, which tells a client's
// going away from such a cancellation, a cancellation is refused only when
// the handler's deadline passes, while a client's going away ends the wait
// with the receive's error.
// Client-streaming and bidi streams, whose requests arrive while the handler
// runs, and server-streaming methods the registry does not know are
// fingerprinted by the method alone.
//
// A store vouches for a record's absence only for attempts created at least
// the clock skew after its horizon: when it began retaining (a memory
// store's construction; on Redis a tenant's first request, and any restart,
// failover or flush). An attempt this server minted for the request (its
// caller sent no header, or is not trusted) cannot have had an earlier try,
// so it is begun whatever the horizon (idempotency.BeginRequest.Minted) and
// such callers are served from the store's first moment. A trusted peer's
// attempt created before the horizon plus the skew is refused UNKNOWN,
// ATTEMPT_UNVERIFIABLE, final, without running anything; the message says
// the store began retaining less than the skew before the attempt was
// created, and the refusal of a numbered key's first try carries a
// retry-after until an attempt newly created by any trusted peer would be
// verifiable (the horizon plus twice the skew, as a peer's clock may lag
// by the skew; jittered upwards). An explicit key's refusal carries none:
// another run of its handler may have sent it. The peer's owner ends such a first
// try of a per-run call NOT_ADMITTED, final (a new attempt can succeed,
// after that retry-after). Keep WithClockSkew (and the store's Policy.Skew)
// no larger than the clocks' real error, so that the window stays short.
//
// The handler's error is answered by its meaning (DESIGN.md §3.6): a
// refusal from below stays NOT_ADMITTED (re-addressed to the call this server
// served) only for a method declared NO_SIDE_EFFECTS or an error wrapped with
// status.WithoutEffect; any other tollgate outcome from below, and any error
// without a definite code, becomes UNKNOWN; definite errors keep their code,
// their message and details bounded as tollgate's own outcomes' are
// (status.Bounded: at most 1 KiB of message as grpc-message sends it, a
// longer one cut in the middle, where "…" marks the cut; at most 3 KiB of
// details, a detail that does not fit dropped), in the answer and in the
// record, and a FAILED record replayed to a later try is bounded the same
// way, whatever build or store wrote it.
// A handler panic is not recovered unless WithRecovery is given, and is then
// UNKNOWN (INTERNAL); WithRecovery also answers a panic of the attempt
// store's Begin or Finish as the store's failure. A recorded try whose
// context ended before the store could begin it (a timeout interceptor
// chained outside tollgate's cut it, or its client's deadline passed while
// its request was decoded) is not the store's failure: it is refused
// DEADLINE_EXPIRED (final as below), counted in
// tollgate.deadline.misses{stage=begin} (stage=arrival for a try that came
// after its attempt's deadline), or, canceled before any deadline,
// NOT_ADMITTED with no reason, as admission refuses such a waiter.
//
// A deadline refusal is final exactly when no repeat within the attempt can
// succeed (DESIGN.md §1), and then suggests no delay; otherwise it suggests
// one that reflects the class's queue. The server's DEADLINE_EXPIRED — a try
// past its attempt's deadline on arrival or by the store's clock, a
// stream's request received late, admission's refusal at arrival, in the
// queue or when the context ended there, a context that ended before the
// record was begun — is final when the attempt's deadline is what was lost:
// the deadline that ended the try reads at or after it (after it plus the
// skew when it is a caller's d, set on the caller's clock), or the
// attempt's deadline plus the skew has passed. It is not final when only
// the try's own deadline was lost: its grpc-timeout, or the server's cap
// (WithMaxAttemptTime, counted from each request's arrival, which a repeat
// gets afresh), when the caller's own deadline — its d, or its request's
// deadline for an attempt minted here, never the admission tap's bound;
// none at all — lies beyond. Admission's DEADLINE_UNREACHABLE is a
// prediction and never final; a store's (too little time left to wait for
// replicas) is final when even a repeat's whole time, so judged, could not
// fit the store's work; the client's own is described below. Either
// reason from below, passed up by a handler as NOT_ADMITTED, keeps its
// final flag unless the deadline this server sent below was its cap and
// the caller's own deadline (plus the skew) has not passed.
//
// Calls to tollgate's AttemptService, gRPC health and reflection are the
// control path: no ledger, no records. AttemptService queries are admitted
// through the controller's control class, under the caller's tenant and
// deadline, and so is a trusted peer's try late by more than the skew of a
// recorded call, which only reads its record (as a query, under the
// attempt's tenant; refused like one when the class is full); health checks and control streams (a health Watch, a
// reflection session) take no slot, so that neither a slow store nor a
// long-lived stream can make a healthy server look dead. FenceAttempt from
// a peer this server does not trust (its tries run under attempts minted
// here), or for a method it declares NO_SIDE_EFFECTS (whose calls keep no
// records and run whatever the store holds), is answered UNKNOWN and
// fences nothing: no tombstone could stop such a try.
//
// # Clients
//
//	conn, err := grpc.NewClient(target, interceptor.DialOptions(
//		interceptor.WithAllowance(4),
//		interceptor.WithAttemptTimeout(10*time.Second),
//		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3}),
//	)...)
//
// A call made outside a tollgate handler starts a new attempt at this client,
// its origin: a UUIDv7 identity, a deadline (WithAttemptTimeout, or the
// caller's earlier one) and an allowance (WithAllowance). StartAttempt makes
// several calls share one attempt. A call made inside a handler belongs to
// the handler's attempt and is keyed p.T.k (DESIGN.md §2.2); WithCallKey
// names it explicitly, which a handler of a method declared IDEMPOTENT must
// do for every call to a method with side effects (otherwise the call is
// refused locally, CALL_KEY_REQUIRED, final; the refusal's detail names the
// refused call by the key p.T.k its number gives it, and its first try).
//
// Before each try the client checks that the try fits the deadline (less the
// hop margin, WithHopMargin; otherwise NOT_ADMITTED DEADLINE_UNREACHABLE,
// final when the attempt's deadline is what leaves no time, not final when
// only an earlier context deadline, such as the caller's per-try one, does),
// takes one unit below the origin (none free: NOT_ADMITTED
// ALLOWANCE_EXHAUSTED, counted in tollgate.allowance.exhausted), lends the
// callee its grant (the free units less one per further try its retry policy
// may need, or budget.WithGrant / budget.Split), and replaces the tollgate
// header. After it, the grant is settled from the callee's tollgate-spent
// trailer; without one it is refunded only on the endings DESIGN.md §2.3
// allows (lenient accounting: the peer's status arrived and the call ended OK,
// with a definite code, or with a tollgate refusal naming this call and try)
// and held otherwise; WithStrictAccounting holds it on every completed call
// without the trailer. A try that provably never left the client gives its
// unit back.
//
// A call is repeated, under its RetryPolicy (WithRetry, WithMethodRetry) and
// the target's retry budget (WithRetryBudget), only when its last try is
// known to have had no effect: NOT_ADMITTED (and not final), which includes
// a try never sent unless its error has a definite code (then the call ends
// with that error, FAILED). A refusal that names an attempt other than the
// call's and came without tollgate-spent is UNKNOWN: a server that does not
// speak tollgate passed its callee's refusal up, and its own handler ran.
// Waits are exponential with full jitter, never shorter than the peer's
// retry-after (itself jittered), and never past the deadline: the wait is
// drawn first, and when the one drawn would leave no useful try before the
// deadline, the call ends with its last try's outcome, so with little time
// left how many repeats a call gets varies from call to call. A try whose
// outcome is UNKNOWN is first resolved: the owner sends FenceAttempt(n) to
// the callee's AttemptService through its invoker (never back through the
// chain, never charged a unit, on a context detached from the caller's with
// a grace after the deadline, WithResolutionGrace) and polls while the
// record is IN_PROGRESS. SUCCEEDED returns the stored response (COMMITTED for
// a stream or a response not kept), FAILED its definite error, FENCED lets the
// call repeat as try n+1; ABANDONED, UNKNOWN, a failed query or a callee
// without an AttemptService end the call UNKNOWN with its attempt ID.
// IDEMPOTENT methods repeat without the query at a callee without records
// (a definite error such a repeat meets ends the call UNKNOWN: the lost try
// may have taken effect); NO_SIDE_EFFECTS methods repeat freely. Once a try was UNKNOWN, or met
// ATTEMPT_IN_PROGRESS or ATTEMPT_FENCED, only a finished record or a FENCED
// answer can end the call NOT_ADMITTED. Streams are repeated the same way
// but only before they commit (see StreamReplayLimit). At the origin, a
// refusal for lack of units once the whole allowance is spent is final.
//
// DialOptions also installs the stats handler that tells a try never sent
// from one that may have been, and disables grpc-go's own retry, so that
// tollgate's interceptor is each call's one owner.
//
// # Interceptor order
//
// ServerOptions and DialOptions install their interceptors with
// grpc.ChainUnaryInterceptor / WithChainUnaryInterceptor (and the stream
// equivalents): they compose with the server's and client's own
// interceptors in the order the options are given. To place them elsewhere
// in a chain, NewServerInterceptors and NewClientInterceptors return them as
// plain grpc types (install StatsHandler, grpc.WithDisableRetry and, on a
// server, AdmissionTap and the size limits yourself). The returned functions
// are built once and are safe for concurrent use.
//
// # Observability
//
// The client starts a tollgate.call span per call (parent of each try's
// RPC span) with its method (rpc.system "grpc", rpc.service, rpc.method, as
// the OpenTelemetry RPC conventions name them), the attempt ID, call key,
// try (the last try sent; a repeat refused before it left is not one),
// allowance granted, spent and held (this tier's ledger for the attempt
// when the call ended: at the origin the allowance, the units the attempt's
// calls spent so far and the units of their grants held, below it the
// grant the server received and what it spent and holds), outcome, reason,
// refusing class and, when it sent any, tollgate.queries (the resolution
// queries that may have left the client). A call that does not end OK
// sets span status Error, described by its outcome and reason or gRPC code
// ("NOT_ADMITTED QUEUE_FULL"). Its events are tollgate.allowance.spend (per try, once it
// ended: tollgate.try; units spent — 0 for the origin's tries and for one
// that never left the client —; grant; units free after it),
// tollgate.retry (tollgate.try: the repeat about to be sent, recorded once
// it passed the local checks; reason: why the last try failed; delay: the
// wait before it, in milliseconds) and tollgate.attempt.query (tollgate.try;
// state: the record's state, STATE_<n> for one this version does not know,
// or QUERY_FAILED, with the query's rpc.grpc.status_code), one for each of a
// call's first 16 queries and then for the last query of each resolution
// only. The server adds a tollgate.admission event (decision: admitted,
// refused:<REASON>, or cancelled for a request whose client went away
// before it started; class; queued_ahead: the requests of the class queued
// ahead of this one when the controller decided, from
// admission.Controller.AdmitDecision) to the request's span when one is
// recording (e.g. otelgrpc's), and a tollgate.refusal event (reason) after
// it for a try it admitted and then refused before the handler ran; it
// starts no span of its own. A request the admission tap refuses has no
// span yet: only metrics count it. Metrics:
// tollgate.client.tries{outcome} (tries that may have been sent),
// tollgate.client.queries{state} (resolution queries that may have been
// sent; one refused before it left has its event, not a count),
// tollgate.allowance.spent (one unit per try below the origin that may have
// reached its callee), tollgate.allowance.held (units of grants held on an
// ending that proved nothing of what the callee spent),
// tollgate.allowance.reconciled (units of held grants a finished record
// settled, spent or freed as it says), tollgate.allowance.exhausted,
// tollgate.retry_budget.exhausted, tollgate.metadata.malformed{trusted},
// tollgate.deadline.misses{stage=arrival} (tries refused DEADLINE_EXPIRED
// for coming after their attempt's deadline: by the server's clock, before
// admission, or by the store's when it begins the try; and server-streaming
// tries, whose one request is received before admission, that a deadline
// ended before their request came),
// tollgate.deadline.misses{stage=begin} (recorded tries whose deadline
// passed while the store began them, before their handler ran),
// tollgate.server.refusals{reason} (tries refused after admission, before
// the handler ran: the store failed or refused, or the call's record
// did), and the admission package's. No tenant or attempt ID is a metric
// label. The README's Observability section lists every instrument with its
// unit and attributes. Providers come from options, by default the global
// ones read at construction; until a global provider is set, that is
// OpenTelemetry's delegating global, which forwards to the first provider
// set later.
package interceptor

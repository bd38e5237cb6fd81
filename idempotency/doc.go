// Package idempotency keeps the records that let a server run each call of an
// attempt at most once, and answer honestly when it cannot tell.
//
// # The model
//
// An attempt is one user-level operation, named by an attempt ID (a UUIDv7
// minted by its origin) and bound by one deadline d. Inside it, each logical
// RPC is a call named by a call key; every sending of a call is a try,
// numbered 1, 2, 3… by the call's owner. A server with a [Store] keeps one
// record per (tenant, attempt ID, call key, method) — a [Key] — holding a
// 128-bit [Fingerprint] of the method and request bytes.
//
// Before running a handler the server begins the try ([Store.Begin]). The
// store either starts it — the record reads IN_PROGRESS, with a lease until
// d + skew — or returns the record that stops it, as a [Refusal]:
//
//   - a finished record (SUCCEEDED, FAILED, UNKNOWN) answers every try,
//     whatever its number;
//   - IN_PROGRESS answers "in progress"; once its lease runs out it reads
//     ABANDONED, forever: the try's effect is unknown and no try runs again;
//   - a tombstone FENCED(n) stops tries ≤ n and lets try n+1 start, keeping
//     the units the call spent;
//   - a request with a different fingerprint is a mismatch;
//   - a try at or after d + skew, when its lease would already have ended, is
//     refused (deadline expired);
//   - an attempt outside the horizon is unverifiable (unless the server
//     minted it for the request: see below).
//
// After the handler the server finishes the try ([Store.Finish]): SUCCEEDED
// with the response (kept up to a size limit), FAILED with a definite status,
// FENCED for a try that had no effect, UNKNOWN for anything else.
//
// # Absence and the horizon
//
// A missing record means "never ran" only if the store would still hold it
// had the call run. The store's horizon is the earliest attempt creation time
// for which it can vouch for that: the moment it began retaining (the memory
// store's construction; for Redis, the first use after any flush, restart,
// restore or failover). [Store.Get] and [Store.Fence] answer UNSEEN for an
// absent record, and fence it, only when the attempt's UUIDv7 time ts
// satisfies ts − skew ≥ horizon and ts ≤ now + skew, and no record of it can
// have expired yet; otherwise UNKNOWN. Every try of an attempt outside the
// horizon is refused as unverifiable, even when a record is present, because
// a restored record may be older than the truth. See [Policy.Vouches].
//
// So for the first skew after a store begins retaining (a restart, a
// failover, a flush, or on Redis a tenant's first request), a tollgate
// client's attempts created in that window are refused: the server answers
// ATTEMPT_UNVERIFIABLE, final, and the client ends a first try of a per-run
// call NOT_ADMITTED, final, with a retry-after until a new attempt would be
// verifiable by any trusted peer's clock ([BeginResult].VerifiableFrom plus
// the skew). A new attempt then succeeds. A
// skew no larger than the clocks' real error keeps the window short. An
// attempt the server minted itself for the request — its caller sent no
// tollgate header, or is not trusted — can have had no earlier try anywhere,
// so it is never unverifiable for the horizon ([BeginRequest].Minted): such
// callers are served from the store's first moment.
//
// Records live TTL after their last write, and never less than d + skew +
// grace; no store evicts one earlier. A full store refuses new tries
// ([ErrStoreFull]) instead.
//
// # Stores and the service
//
// [NewMemoryStore] keeps records in memory for a server that runs as a single
// replica, ever ([SingleReplica]); package idempotency/redisstore shares them
// between replicas through Redis. Package idempotency/storetest is the
// conformance suite both pass. [NewAttemptService] serves
// tollgate.v1.AttemptService from any Store, scoped to the caller's tenant
// ([ContextWithTenant]). [LevelOf] and [ResponseType] read a method's
// declared idempotency level and output type from the protobuf registry, for
// the interceptor: methods declared NO_SIDE_EFFECTS keep no records.
package idempotency

// Package admission decides, cheaply and early, whether a server takes a
// request: reserved slots and bounded queues per workload class,
// deadline-aware admission, tenant limits, and degradation with hysteresis
// (DESIGN.md §3.9, §3.10, §3.12). It knows nothing of gRPC servers; the
// interceptor package asks a [Controller] for a [Permit] before it runs a
// handler and releases the permit when the handler returns.
//
// # Classes
//
// Every request belongs to one [Class], chosen by the method (exact names,
// whole services, prefixes: [WithMethods]), by a function of the request's
// context ([WithClassifier]) or by default. A class has its own reserved
// Slots: at most that many of its requests run on them, and it uses another
// class's slots only when that class lends idle ones (LendIdle). A request
// that finds no slot waits in its class's FIFO queue, bounded in items and
// bytes; a request that finds the queue full is refused. The built-in
// [ControlClass] (2 slots, 8 waiting) serves tollgate's AttemptService,
// gRPC health and reflection, so that observation and recovery answer while
// every other class is saturated; tollgate's interceptor also admits there,
// marked [Request].Control, a trusted peer's try that came after its
// attempt's deadline, which only reads its call's record as a query does.
// tollgate's interceptor gives health and
// reflection (and every control stream) no slot at all, and the tap never
// refuses them.
//
// # The decision
//
// Admit decides in stages, cheapest first, and refuses with a typed
// NOT_ADMITTED status (package status) naming the class and, where a repeat
// can help, a retry-after that reflects the class's queue (for TENANT_LIMIT
// the time until the tenant's first running request ends, and the class's
// predicted wait too unless the class has a slot free) and is
// jittered so refused clients do not return together, in [½, 1½) of that
// wait, capped so that it stays below [WithMaxRetryAfter]'s bound (default
// [DefaultMaxRetryAfter], 30 s; a longer predicted wait suggests a delay
// spread over [⅓, 1) of the bound). SHED and DRAINING are not derived from
// the predicted wait. SHED suggests the time until the class can be
// admitted again as far as the controller knows: the end of the last
// override freezing the class; for an optional class shed while Degraded,
// the end of the overrides forcing Degraded, and under the state machine's
// own Degraded the end of the current window (one healthy window moves
// Degraded to Recovering, whose first step re-admits the class), or while
// Degraded is held after a fall back from Recovering, the end of the window
// that would complete ExitAfter healthy ones — a lower bound, since the
// window may be overloaded and an operator may clear an override sooner.
// That time is jittered above itself, never before it, over half of itself
// or half a degradation window, whichever is longer (the clients shed
// before one instant are all told that instant: the window's half keeps
// those shed just before it from coming back together), with the same
// cap (a time beyond ⅔ of the bound suggests [⅔, 1) of the bound).
// DRAINING carries no retry-after: the server is shutting down, and a
// repeat belongs on another server. DEADLINE_UNREACHABLE's retry-after is
// the class's predicted wait (its learned mean service time when a request
// would start at once), which may exceed the refused request's own time
// left: no wait makes the work fit that deadline, only a repeat with a
// longer one (it is never final for that reason):
//
//  1. size: larger than the class's MaxRequestBytes → REQUEST_TOO_LARGE;
//  2. class and tenant: a frozen class or an optional class while degraded
//     → SHED; a tenant over its queued items or queued work (once its
//     waiters that can no longer finish have left), or over its running
//     requests in a class without a queue that has a slot free →
//     TENANT_LIMIT;
//  3. deadline: already passed, or reached while the class's service
//     time is unknown (no time left for work of unknown length) →
//     DEADLINE_EXPIRED; predicted wait (for a
//     request held back only by its tenant's running limit, its tenant's
//     own start wait; for one whose tenant is at that limit in a full
//     class, the longer of the two) + learned service time + safety margin
//     later than the deadline → DEADLINE_UNREACHABLE (work that would
//     finish exactly at its deadline is admitted);
//  4. a slot now, or a place in the bounded queue → QUEUE_FULL (or
//     CONCURRENCY_FULL for a class without a queue; TENANT_LIMIT when only
//     the tenant's running limit keeps the request from a free slot).
//
// When a slot frees, a window closes or an override is set or expires, the
// queue is re-checked from its head: work that can no longer finish by its
// deadline is dropped unrun with DEADLINE_EXPIRED, never started, up to the
// first waiter that cannot start yet; when a new request of its class
// arrives (that passes the size and shed checks), or a [Permit.Release]
// teaches its class's service estimate, every such waiter of the class is dropped, so it
// never holds a place useful work could take; [Controller.Stats] drops
// every class's such waiters, and starts what can start, before its
// snapshot, as an arrival would before it predicts its wait. On the real clock (Admit and AdmitDecision, not the …At
// methods of virtual clocks) a waiting request also gives up by a timer of
// its own as soon as its deadline less the class's service estimate has
// passed (the timer follows the estimate: a release that at least doubles
// it re-arms the class's waiters; a smaller rise makes it fire late by the
// rise, still before the deadline), so that its caller hears the
// refusal while it still listens; and
// a request leaving the queue may let a lender's idle slot start another
// class's waiter. Refusals and drops of a request held back only by its own
// tenant's running limit (its class had a slot free) are the tenant's
// doing: they do not count as overload for degradation, nor does a waiter
// held so when a window closes count against MaxQueueAge (the wait of a
// request that started does count in full, whatever held it; that of a
// waiter that leaves unrun, its context ended or its deadline out of
// reach, counts as a waiter's still queued when the window closes would);
// TENANT_LIMIT and REQUEST_TOO_LARGE refusals count in no window at all,
// but for a TenantQueueWork refusal of a tenant with nothing waiting and
// under its running limit in a full class, which is the class's overload. Waiting
// requests leave the queue when their context ends: one whose context's
// deadline passed is refused DEADLINE_EXPIRED (the queue held it too long,
// an overload refusal like the dequeue stage's), as is one whose context
// was canceled once its own deadline or the request's had passed, or with
// context.DeadlineExceeded as its cause (a gRPC client's RST_STREAM at its
// deadline can come before the server's timer for it) — final, with no
// delay, once the request's own deadline has passed (no repeat can meet
// it, as at arrival and dequeue), else repeatable with a delay that
// reflects the queue (its context ended by an earlier deadline of its own,
// a per-try timeout); one whose context
// was canceled otherwise (its caller went away) is refused nothing: it
// counts as a decision of its own, cancelled
// (tollgate.admission.decisions{decision=cancelled},
// [ClassStats.Cancelled]), and in no window's decisions, neither an
// overload refusal nor a healthy one. Its context decides this whichever
// call finds it: a release, an arrival or Stats that would start, or drop
// as unable to finish, a waiter whose context has already ended (before
// its own goroutine has seen it), and a shed, an override's trim or Close
// that would refuse it (SHED, QUEUE_FULL, DRAINING), takes it out as its
// context's ending says — a trim before any live waiter — and the slot
// goes to the next waiter, so a caller that went away is never started,
// nor counted or told as the queue's dequeue DEADLINE_EXPIRED or as
// another refusal. Nor does it keep its place where no call reaches it
// (held by its tenant's running limit, behind a waiter that cannot
// start): its context's AfterFunc notes the ending, and the next call
// that takes the lock (an arrival, a release, Stats) takes it out first,
// wherever it stands, so that no live arrival is refused QUEUE_FULL or
// TENANT_LIMIT for it; on a virtual clock (AdmitAt) each call looks at the
// waiters' contexts before it moves the time on, and judges such a waiter
// at the latest time the caller had given, when its context ended. A
// request whose context had ended
// before Admit looked at it is counted alike, in its class, but in no
// window (as an arrival after its deadline: the caller's doing). So a
// DEADLINE_EXPIRED refusal, whichever stage says it, is final (no repeat
// can meet a deadline that has passed or that the request can no longer
// finish by, even on the plan an idle class makes, the lesser of its
// learned and expected service times) exactly when the request's own
// Deadline is what was lost, and carries no retry-after (a waiter dropped
// by the learned estimate while that plan still fits is refused not
// final, with one); DEADLINE_UNREACHABLE, a prediction, is never
// final. The controller knows only the deadline it is given: tollgate's
// interceptor, which gives it the try's, makes a final DEADLINE_EXPIRED
// repeatable when that deadline was only the try's own (a per-try timeout,
// or the server's cap from the request's arrival). Each
// permit ends exactly once, with [Permit.Release] after work that ran
// ([Permit.ReleaseMissCounted] when the caller counted the work's deadline
// miss itself, which counts no run miss again),
// [Permit.Abandon] after work that did not run (a replay, a refusal after
// admission), or [Permit.EndStream] after a stream, which teaches nothing
// but counts an end after its deadline as Release does (a run miss, a
// false accept); the first call wins and extra calls do nothing. Each stage but the slot and
// queue bound can be switched off with [WithStages].
//
// # Learning and prediction
//
// Each class learns its service time from completed work: an exponentially
// weighted mean and a streaming p95, seeded by ExpectedServiceTime, from
// permits ended with Release or ReleaseMissCounted (never Abandon or
// EndStream). Each sample is capped by
// MaxServiceTime (default [DefaultMaxServiceTime]) and, after 20 samples, by
// 4 × the learned p95, so one hung request cannot lock a class out. The
// p95 climbs a step (a tenth of the larger estimate) per slower sample, so
// it lags the mean after the first samples above a low seed; it comes down
// by a twentieth of a step per faster sample. Work that ended after its
// deadline (a handler the deadline cut) teaches its time as a lower bound:
// it may raise the p95, so a hang is learned, but never lowers it. So that
// a p95 a hang raised does not keep refusing healthy work for long after
// it (those refusals would also withhold the samples that bring it down),
// 30 completed samples in a row below the p95 take it down at once to what
// completed work bears out — the larger of their largest and the p95 of
// completed samples alone — when it stands at least twice above that. A
// stationary service's p95 is left as it is: were the p95 right, such a
// run would come about one time in five, and its largest lies near the
// 92nd percentile (in the fast mode of a bimodal service), which would
// make its slow requests false accepts. A cut sample ends such a run only
// if it started after the run's first sample (one that hung from before is
// older news than work that completed since). The deadline
// stage plans with the larger of the two, and [ClassStats].ServiceP95 reads
// at least the mean until 20 samples. A class
// that is idle (nothing of it running or waiting) admits a request whose
// deadline leaves room for ExpectedServiceTime (any, when that is 0) even if
// the learned estimate is larger: the probe re-teaches the estimate, and at
// most one such request runs at a time. A class without
// ExpectedServiceTime that has learned nothing yet predicts no service time:
// until its first request is released, its deadline stage refuses only
// deadlines that have passed or are reached and waits longer than the time
// left, and admits a request with any time left, however little. A request
// that finds a slot free predicts no wait (Stats.PredictedWait is 0 then,
// as its decision's wait is). The predicted wait of a request that finds no
// slot is the learned work queued ahead plus the remaining work of the
// class's running requests, spread over its slots (seed 004); each running
// request counts the learned mean minus its elapsed time, but at least a
// tenth of the mean, so an overdue request hides no one else's work (a
// stream counts otherwise: see Request.Stream). Requests that
// were admitted and then finished late are counted as false accepts;
// DEADLINE_UNREACHABLE refusals that later starts show to have been
// avoidable as false rejects.
//
// While a class knows nothing of its service time (no ExpectedServiceTime
// and no release yet taught one — the built-in control class starts so),
// that sum would be 0 however long its running work has run. The time a
// running request has run is a lower bound of its service time: with
// nothing else to go by, [ClassStats].PredictedWait and the retry-afters
// expect each running request to run as long again as it has, but not past
// its deadline (where its handler's context ends), and each waiter to take
// the running requests' average run so far, spread over the slots its
// streams do not hold (a stream holds its slot for its lifetime: its age
// is no work that other slots share; while only streams run, the first to
// end, each living as long again as it has, frees a slot); a TENANT_LIMIT
// refusal's retry-after, the time until the tenant's first running
// request ends, expects a running unary request to run as long again, or
// until its deadline, too. The deadline stage does not use that guess: it
// decides as above.
//
// # Degradation and overrides
//
// Time is cut into windows. A window is overloaded when refusals for lack of
// capacity or time reach a ratio, or a request waited too long. Requests
// that arrive already expired, or whose deadline is too short even without a
// wait, are the caller's problem and count in no window. After
// EnterAfter overloaded windows the controller is Degraded and sheds
// optional classes; a healthy window makes it Recovering, where optional
// classes get their slots back in steps (the refusals and waits those
// lowered slots cause, like shedding's, are the controller's own and count
// in no window; an optional class whose load exceeds even its configured
// slots makes the controller cycle through Normal instead); only ExitAfter
// consecutive healthy
// windows (default 3) make it Normal again, and an overloaded window while
// Recovering returns it to Degraded for ExitAfter healthy windows, so an
// oscillating load cannot make it flap. Lowered limits bind lending too: a
// shed optional class that lends its idle slots (LendIdle) lends none while
// Degraded, and no more than its step while Recovering, so the classes that
// borrow from it lose that capacity then (running borrowers keep their
// slots: nothing is preempted); only a lender that is not optional lends in
// every mode (the README's Admission section shows how to split one).
// Operators may freeze a class, lower its limits or force a
// mode with an [Override]: bounded (at most [MaxOverrides] in force at
// once), attributed, emitted as OpenTelemetry events, and expiring by
// itself.
//
// # Early refusal and observability
//
// [Controller.TapHandle] is a tap.ServerInHandle that refuses new streams of
// a class that has no free slot and whose queue is at its bound (QUEUE_FULL;
// CONCURRENCY_FULL for a class without a queue), or that is shed, frozen or
// draining (SHED, DRAINING), by reading one atomic flag, before the request
// is read; once a waiter of a full queue may no longer be able to finish (by
// the queue's earliest deadline less the service estimate), or a waiter
// whose caller has gone stands in it or in the queue of a class that lends
// its idle slots (which lends none while the waiter stands), it lets
// requests through to Admit, which drops or takes out such waiters first.
// It counts its
// refusals in an atomic counter per class and
// reason; they count in the degradation windows and in [Controller.Stats]
// like Admit's. [Controller.AdmitDecision] is Admit that also returns a
// [Decision]: the request's class and how many requests of it were queued
// ahead, counted under the lock as the controller decides (also on the
// permit: [Permit.QueuedAhead]), so per-request telemetry needs no
// [Controller.Stats] snapshot. Metrics (DESIGN.md §5) go to the meter provider of
// [WithMeterProvider]: tollgate.admission.decisions{decision,class,reason}
// (decision admitted, refused with its reason, or cancelled with none),
// tollgate.queue.estimated_work, tollgate.queue.oldest_age,
// tollgate.admission.running, tollgate.admission.slots_used and
// tollgate.queue.length (per class, Stats' Running, UsedSlots and Queued as
// the last call left them: a collection brings nothing up to date),
// tollgate.task.start_delay, tollgate.task.service_time,
// tollgate.deadline.misses{stage}, tollgate.admission.false_accepts,
// tollgate.admission.false_rejects, tollgate.admission.mode (the effective
// mode: 1 NORMAL, 2 DEGRADED, 3 RECOVERING),
// tollgate.admission.mode_transitions{mode,previous} (each change of the
// state machine's mode, counted when a call or the controller's timer
// brings it up to date, as Stats().Transitions counts it) and
// tollgate.queue.wait_prediction_error{class,direction} (seed 004's
// prediction error: how far the predicted wait of a request that waited and
// started was from its actual wait, as an absolute value; direction under
// when it waited longer than predicted, over when less, exact when as
// predicted). The duration histograms' buckets run from 0.5 ms to 30 s.
// No label carries a tenant. README.md tables each instrument's kind, unit
// and attributes.
//
// # Time
//
// The controller reads the wall clock on Admit and Release. Simulations
// drive it on a virtual clock with [Controller.AdmitAt], [Permit.ReleaseAt],
// [Permit.ReleaseMissCountedAt], [Permit.AbandonAt], [Controller.ModeAt], [Controller.StatsAt] and
// [Controller.OverridesAt]; windows and overrides are evaluated lazily from
// the times given, in time order: the windows that ended before an
// override expired are judged with it in force, however late the next
// call comes (what the expiry lets happen — a waiter starts — happens at
// that call's time, after the windows that ended by then, which see it
// waiting). On the real clock, while requests wait and time alone
// will change the state (an override expires, or a window ends while the
// controller is not Normal or the tap refuses a class), the controller arms
// one timer (time.AfterFunc) that brings the state up to date, so that the
// waiters an expired override or a new step lets start do start; its
// function runs on a goroutine of its own when it fires, as timers' do. A
// waiting Admit call with a deadline also keeps a give-up timer, in its
// caller's goroutine. While its last admission was an AdmitAt (or
// AdmitDecisionAt), whose clock is the caller's, the controller arms no
// timer of its own, its metrics observe it as of the latest time
// given, and these calls without a time of their own ([Controller.Stats],
// [Controller.Mode], [Controller.Overrides], [Controller.SetOverride],
// [Controller.ClearOverride], [Controller.RetryAfter], [Permit.Release],
// [Permit.ReleaseMissCounted], [Permit.Abandon], [Permit.EndStream], and
// the tap,
// [Controller.TapHandle]) act at that latest time, not the wall clock's;
// an Admit returns it to the wall clock. That latest time is only the
// earliest a plain Release's work can have ended, so a Release whose time,
// or whose permit's start, was a caller's teaches no service time (it
// still counts a finish after the deadline that its time proves, when the
// permit started on the same kind of clock);
// [Permit.ReleaseAt] gives the end, and teaches. Driving one controller on
// both clocks at once is not supported: the waiters of one wait on the
// other's calls.
// [Controller.Close] stops the timer (a run already under way finishes),
// unregisters the metric callbacks and refuses waiting (but for those whose
// context has ended, which leave as it says) and later requests with
// DRAINING, but for the control class, which stays open so that
// callers can still resolve the tries the server ran; permits already
// granted stay valid. Collecting metrics is
// an observation only: it changes no state (the mode gauge is the mode that
// the windows closed by now would give, worked out and put back), so a
// controller behaves alike whether and whenever its metrics are read.
package admission

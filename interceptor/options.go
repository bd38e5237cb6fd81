package interceptor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/internal/nilvalue"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/grpclog"
)

// Defaults of the client and server options.
const (
	// DefaultAllowance is the units of an attempt minted by a client
	// (WithAllowance) or a server (WithDefaultAllowance).
	DefaultAllowance = 4
	// DefaultAttemptTimeout is an origin's attempt deadline (WithAttemptTimeout).
	DefaultAttemptTimeout = 10 * time.Second
	// DefaultMaxTries is a RetryPolicy's tries, the first included.
	DefaultMaxTries = 3
	// MaxTriesCap is the most tries a RetryPolicy may allow.
	MaxTriesCap = 10
	// DefaultHopMargin is how much earlier each try's deadline is set (WithHopMargin).
	DefaultHopMargin = 5 * time.Millisecond
	// DefaultMinTryTime is the least time a try needs to be sent (WithMinTryTime).
	DefaultMinTryTime = time.Millisecond
	// DefaultClockSkew is the clock difference assumed between trusted peers (WithClockSkew).
	DefaultClockSkew = 500 * time.Millisecond
	// DefaultMaxAttemptTime caps an attempt's deadline at a server (WithMaxAttemptTime).
	DefaultMaxAttemptTime = 30 * time.Second
	// DefaultMaxAllowance caps the units a caller may grant a server (WithMaxAllowance).
	DefaultMaxAllowance = 100
	// DefaultMaxRecvMsgSize is grpc.MaxRecvMsgSize (WithMaxRecvMsgSize).
	DefaultMaxRecvMsgSize = 4 << 20
	// DefaultMaxStreams is grpc.MaxConcurrentStreams (WithMaxConcurrentStreams).
	DefaultMaxStreams = 1024
	// DefaultMaxHeaderListSize is grpc.MaxHeaderListSize
	// (WithMaxHeaderListSize): 64 KiB of request metadata, as Envoy's
	// default of 60 KiB allows about as much.
	DefaultMaxHeaderListSize = 64 << 10
	// DefaultResolutionGrace is how long after the deadline a resolution may
	// still query (WithResolutionGrace).
	DefaultResolutionGrace = time.Second

	maxUnitsOnWire          = 1_000_000
	maxAttemptTimeoutCap    = 24 * time.Hour
	headerKey               = "tollgate"
	spentTrailerKey         = "tollgate-spent"
	attemptServicePrefix    = "/tollgate.v1.AttemptService/"
	healthServicePrefix     = "/grpc.health.v1.Health/"
	reflectionV1Prefix      = "/grpc.reflection.v1.ServerReflection/"
	reflectionV1AlphaPrefix = "/grpc.reflection.v1alpha.ServerReflection/"
)

// logger is tollgate's grpclog component.
var logger = grpclog.Component("tollgate")

// ErrInvalidOption is wrapped by every error NewServerOptions and
// NewDialOptions return for an invalid option value.
var ErrInvalidOption = errors.New("interceptor: invalid option")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// ----- client -----

// ClientOption configures tollgate's client interceptors (DialOptions).
type ClientOption interface{ applyClient(*clientConfig) }

type clientOptionFunc func(*clientConfig)

func (f clientOptionFunc) applyClient(c *clientConfig) { f(c) }

type clientConfig struct {
	allowance      int64
	attemptTimeout time.Duration
	// attemptTimeoutSet: WithAttemptTimeout was given, so the client is
	// meant to mint attempts, and its margins must leave time in them.
	attemptTimeoutSet bool
	retry             RetryPolicy
	methodRetry       map[string]RetryPolicy
	retryBudget       []budget.RetryBudgetOption
	noRetryBudget     bool
	grace             time.Duration
	strict            bool
	serviceConfig     string
	hopMargin         time.Duration
	minTryTime        time.Duration
	tracer            trace.TracerProvider
	meter             metric.MeterProvider
	now               func() time.Time
}

func defaultClientConfig() clientConfig {
	return clientConfig{
		allowance:      DefaultAllowance,
		attemptTimeout: DefaultAttemptTimeout,
		retry:          RetryPolicy{MaxTries: DefaultMaxTries},
		grace:          DefaultResolutionGrace,
		hopMargin:      DefaultHopMargin,
		minTryTime:     DefaultMinTryTime,
		tracer:         otel.GetTracerProvider(),
		meter:          otel.GetMeterProvider(),
		now:            time.Now,
	}
}

func (c *clientConfig) validate() error {
	switch {
	case c.allowance < 0 || c.allowance > maxUnitsOnWire:
		return invalid("allowance %d outside [0, %d]", c.allowance, maxUnitsOnWire)
	case c.attemptTimeout <= 0 || c.attemptTimeout > maxAttemptTimeoutCap:
		return invalid("attempt timeout %v outside (0, %v]", c.attemptTimeout, maxAttemptTimeoutCap)
	case c.hopMargin < 0:
		return invalid("hop margin %v is negative", c.hopMargin)
	case c.minTryTime < 0:
		return invalid("minimum try time %v is negative", c.minTryTime)
	case c.hopMargin >= maxAttemptTimeoutCap || c.minTryTime >= maxAttemptTimeoutCap-c.hopMargin:
		// No attempt lasts so long: every call would be refused.
		return invalid("hop margin %v and minimum try time %v leave no time in an attempt of %v, the longest",
			c.hopMargin, c.minTryTime, maxAttemptTimeoutCap)
	case c.attemptTimeoutSet && (c.hopMargin >= c.attemptTimeout || c.minTryTime >= c.attemptTimeout-c.hopMargin):
		// Every call of an attempt this client starts would be refused
		// locally, DEADLINE_UNREACHABLE, before it was sent. Only when
		// the timeout was set: the default applies to attempts a client
		// mints, and one used inside handlers, or under StartAttempt,
		// mints none (its calls have their attempt's deadline).
		return invalid("hop margin %v and minimum try time %v leave no time in the attempt timeout %v: every call this client starts would be refused DEADLINE_UNREACHABLE",
			c.hopMargin, c.minTryTime, c.attemptTimeout)
	case c.tracer == nil || c.meter == nil:
		return invalid("nil tracer or meter provider")
	case c.grace < 0 || c.grace > time.Minute:
		return invalid("resolution grace %v outside [0, 1m]", c.grace)
	}
	if c.serviceConfig != "" {
		if err := jsonObject(c.serviceConfig); err != nil {
			return invalid("default service config is not a JSON object: %v", err)
		}
	}
	for m, p := range c.methodRetry {
		if !validFullMethod(m) {
			return invalid("method %q is not a full method name \"/pkg.Service/Method\"", m)
		}
		if err := p.validate(); err != nil {
			return fmt.Errorf("%w (method %s)", err, m)
		}
		c.methodRetry[m] = p
	}
	if _, err := budget.NewRetryBudget(c.retryBudget...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOption, err) // err names the budget
	}
	return c.retry.validate()
}

// jsonObject returns nil if s is one JSON object, the form of a gRPC
// service config, else what it is instead.
func jsonObject(s string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return err
	}
	if m == nil {
		return errors.New("null")
	}
	return nil
}

// WithAllowance sets the number of call units an attempt that starts at this
// client (the origin) lets all layers below it spend, across every try of
// every call. Default DefaultAllowance (4); 0 lets no call below the origin
// be sent (the origin's own calls still repeat under their policy, since its
// tries are never charged, unless the callee answers ALLOWANCE_EXHAUSTED: it
// needed units the origin can never lend, so the call ends with that
// refusal, final, after one try). Once an allowance above 0 is all spent, a
// repeat of the origin's call is refused ALLOWANCE_EXHAUSTED, final: its
// callee could not be lent a unit (after a try whose outcome is not known,
// the call ends UNKNOWN with that try's error instead). At most 1,000,000.
func WithAllowance(units int64) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.allowance = units })
}

// WithAttemptTimeout sets the deadline of an attempt that starts at this
// client, counted from its first call; the caller's context deadline wins
// when it is earlier. Default DefaultAttemptTimeout (10 s); at most 24 h.
func WithAttemptTimeout(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.attemptTimeout, c.attemptTimeoutSet = d, true })
}

// WithRetry sets the retry policy of the calls this client owns.
func WithRetry(p RetryPolicy) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.retry = p })
}

// WithMethodRetry sets the retry policy of one method ("/pkg.Service/Method",
// as grpc-go names it: a name of another form is refused with
// ErrInvalidOption, since it could never match), overriding WithRetry's for
// it.
func WithMethodRetry(fullMethod string, p RetryPolicy) ClientOption {
	return clientOptionFunc(func(c *clientConfig) {
		if c.methodRetry == nil {
			c.methodRetry = map[string]RetryPolicy{}
		}
		c.methodRetry[fullMethod] = p
	})
}

// WithRetryBudget configures the retry budget kept per target (one per
// ClientConn target): every repeat, and every resolution of an unknown
// outcome however many polls it takes, costs a token; first tries earn a
// fraction of one. A call that finds no token for a repeat ends NOT_ADMITTED
// RETRY_BUDGET_EXHAUSTED; one whose try's outcome is unknown and finds none
// for its resolution ends UNKNOWN with that reason, unqueried. Defaults: budget.DefaultRetryRatio (retries within 10% of
// requests), budget.DefaultMinRetriesPerSecond, budget.DefaultMaxRetryTokens.
func WithRetryBudget(opts ...budget.RetryBudgetOption) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.retryBudget = opts })
}

// WithoutRetryBudget turns the per-target retry budget off: repeats are
// bounded only by the retry policy, the allowance and the deadline.
func WithoutRetryBudget() ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.noRetryBudget = true })
}

// WithResolutionGrace sets how long after the attempt's deadline, or the
// caller's context's deadline when that is earlier, the owner may still
// query the state of a try whose outcome is unknown (the queries do no work,
// and an unresolved UNKNOWN is the worst answer tollgate gives): a call in
// doubt at its deadline may return up to the grace later. A caller that
// cancels its context is answered UNKNOWN at once. Default DefaultResolutionGrace (1 s); at most 1 min.
func WithResolutionGrace(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.grace = d })
}

// WithDefaultServiceConfig passes a default service config (JSON) to the
// connection, as grpc.WithDefaultServiceConfig does. NewDialOptions checks
// that it is one JSON object (ErrInvalidOption otherwise); the fields are
// grpc-go's to check, and grpc.NewClient refuses a config it cannot parse. A
// retryPolicy or hedgingPolicy would be a second retry loop beside tollgate's
// owner, so DialOptions keeps grpc-go's retry disabled (it ignores them) and
// logs a warning through grpclog naming what it ignores. Service configs a
// name resolver supplies are not seen by tollgate; they are ignored the same
// way, without a warning.
func WithDefaultServiceConfig(json string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.serviceConfig = json })
}

// WithStrictAccounting asks every callee to report the units it spent even
// when none (the header's r=1), and counts a completed call without that
// report as having spent its whole grant until reconciled (DESIGN.md §2.3).
// Use it when a hop between two tollgate peers may be a proxy that retries.
// A refusal by a callee's admission tap (AdmissionTap) carries no trailer,
// so a strict caller holds the grant it lent to the refused try, which a
// lenient caller refunds.
func WithStrictAccounting() ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.strict = true })
}

// withClientClock makes the client read the time from now (tests).
func withClientClock(now func() time.Time) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.now = now })
}

// WithHopMargin sets how much earlier than the caller's deadline each
// outgoing try's deadline is set, so the callee's answer can travel back.
// Default DefaultHopMargin (5 ms). A negative margin, or one that with
// WithMinTryTime's leaves no time in the client's own attempts, is
// ErrInvalidOption: every call the client starts would be refused. The hop
// margin plus the minimum try time must be below 24 h, the longest attempt,
// and below WithAttemptTimeout's when it is given; the default attempt
// timeout does not bound them, since a client used only inside handlers
// or under StartAttempt mints no attempt of its own (give
// WithAttemptTimeout to have it checked).
func WithHopMargin(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.hopMargin = d })
}

// WithMinTryTime sets the least remaining time (after the hop margin) a try
// needs to be worth sending; a try with less is refused locally with
// NOT_ADMITTED DEADLINE_UNREACHABLE (final when the attempt's own deadline
// leaves less; not final when only the context's earlier one does, such as
// a caller's per-try deadline). Default DefaultMinTryTime (1 ms). A
// negative value, or one that with the hop margin leaves no time in the
// client's own attempts (see WithHopMargin), is ErrInvalidOption.
func WithMinTryTime(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.minTryTime = d })
}

// WithClientTracerProvider sets the tracer provider of the tollgate.call
// spans. Default: the global provider, otel.GetTracerProvider(), read at
// construction: until a global provider is set, that is OpenTelemetry's
// delegating global, which forwards to the first provider set later, so a
// global provider set after construction is used too.
func WithClientTracerProvider(tp trace.TracerProvider) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.tracer = tp })
}

// WithClientMeterProvider sets the meter provider of the client's metrics.
// Default: the global provider, otel.GetMeterProvider(), read at
// construction: until a global provider is set, that is OpenTelemetry's
// delegating global, which forwards to the first provider set later, so a
// global provider set after construction is used too.
func WithClientMeterProvider(mp metric.MeterProvider) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.meter = mp })
}

// ----- server -----

// ServerOption configures tollgate's server interceptors (ServerOptions).
type ServerOption interface{ applyServer(*serverConfig) }

type serverOptionFunc func(*serverConfig)

func (f serverOptionFunc) applyServer(c *serverConfig) { f(c) }

type serverConfig struct {
	admission    *admission.Controller
	store        idempotency.Store
	nilStore     bool // WithAttemptStore(nil)
	admissionTap bool
	// streamRequestFirst: a server-streaming request is received before
	// admission and the record (WithoutStreamRequestFirst).
	streamRequestFirst  bool
	tenant              func(context.Context) string
	trusted             func(context.Context) bool
	defaultAllowance    int64
	defaultAllowanceSet bool // by WithDefaultAllowance (the error for a maximum below it says which to set)
	maxAllowance        int64
	maxAttemptTime      time.Duration
	maxAttemptTimeSet   bool // by WithMaxAttemptTime; else the default, lowered to the store's policy
	skew                time.Duration
	recoverPanics       bool
	maxRecvMsgSize      int
	maxHeaderListSize   uint32
	maxStreams          uint32
	maxStreamsSet       bool // by WithMaxConcurrentStreams, kept as given; else the default, raised past admission's capacity (validate)
	meter               metric.MeterProvider
	now                 func() time.Time
}

func defaultServerConfig() serverConfig {
	return serverConfig{
		admissionTap:       true,
		streamRequestFirst: true,
		tenant:             func(context.Context) string { return "" },
		trusted:            func(context.Context) bool { return false },
		defaultAllowance:   DefaultAllowance,
		maxAllowance:       DefaultMaxAllowance,
		maxAttemptTime:     DefaultMaxAttemptTime,
		skew:               DefaultClockSkew,
		maxRecvMsgSize:     DefaultMaxRecvMsgSize,
		maxHeaderListSize:  DefaultMaxHeaderListSize,
		maxStreams:         DefaultMaxStreams,
		meter:              otel.GetMeterProvider(),
		now:                time.Now,
	}
}

func (c *serverConfig) validate() error {
	switch {
	case c.tenant == nil:
		return invalid("nil tenant function")
	case c.trusted == nil:
		return invalid("nil trusted-peer function")
	case c.maxAllowance < 0 || c.maxAllowance > maxUnitsOnWire:
		return invalid("maximum allowance %d outside [0, %d]", c.maxAllowance, maxUnitsOnWire)
	case c.defaultAllowance < 0:
		return invalid("default allowance %d is negative", c.defaultAllowance)
	case c.defaultAllowance > c.maxAllowance && !c.defaultAllowanceSet:
		return invalid("maximum allowance %d is below the default allowance %d: set WithDefaultAllowance too, at most the maximum", c.maxAllowance, c.defaultAllowance)
	case c.defaultAllowance > c.maxAllowance:
		return invalid("default allowance %d above the maximum allowance %d", c.defaultAllowance, c.maxAllowance)
	case c.maxAttemptTime <= 0 || c.maxAttemptTime > maxAttemptTimeoutCap:
		return invalid("maximum attempt time %v outside (0, %v]", c.maxAttemptTime, maxAttemptTimeoutCap)
	case c.skew < 0 || c.skew > time.Minute:
		return invalid("clock skew %v outside [0, 1m]", c.skew)
	case c.maxRecvMsgSize <= 0:
		return invalid("maximum receive message size %d is not positive", c.maxRecvMsgSize)
	case c.maxHeaderListSize < minHeaderListSize:
		return invalid("maximum header list size %d is below %d bytes (a request's own gRPC headers need about that)", c.maxHeaderListSize, minHeaderListSize)
	case c.maxStreams == 0:
		return invalid("maximum concurrent streams is 0")
	case c.meter == nil:
		return invalid("nil meter provider")
	case c.nilStore:
		return invalid("nil attempt store; pass no WithAttemptStore for none")
	case c.store != nil && nilvalue.Typed(c.store):
		return invalid("nil attempt store (a nil %T); pass no WithAttemptStore for none", c.store)
	}
	if c.admission != nil && !c.maxStreamsSet && uint64(c.admission.Capacity()) >= uint64(c.maxStreams) {
		// The default, raised past what admission holds; an explicit
		// bound is the operator's (WithMaxConcurrentStreams).
		c.maxStreams = uint32(min(uint64(c.admission.Capacity())+1, math.MaxUint32))
	}
	if p, ok := c.store.(interface{ Policy() idempotency.Policy }); ok {
		switch pol := p.Policy(); {
		case pol.MaxAttemptDeadline <= 0:
			return invalid("the attempt store's policy MaxAttemptDeadline %v is not positive", pol.MaxAttemptDeadline)
		case pol.Skew != c.skew:
			return invalid("clock skew %v differs from the attempt store's policy skew %v: set both alike (WithClockSkew, the store's WithPolicy)",
				c.skew, pol.Skew)
		case c.maxAttemptTime > pol.MaxAttemptDeadline && !c.maxAttemptTimeSet:
			c.maxAttemptTime = pol.MaxAttemptDeadline // the default, within what the store keeps records for
		case c.maxAttemptTime > pol.MaxAttemptDeadline:
			// The store keeps records TTL ≥ MaxAttemptDeadline + skew +
			// grace: an attempt allowed longer could outlive its records.
			return invalid("maximum attempt time %v exceeds the attempt store's policy MaxAttemptDeadline %v: raise the store's (WithPolicy) or lower WithMaxAttemptTime",
				c.maxAttemptTime, pol.MaxAttemptDeadline)
		}
	}
	return nil
}

// validFullMethod reports whether m reads "/service/method", both parts
// non-empty and without a further slash.
func validFullMethod(m string) bool {
	svc, method, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
	return strings.HasPrefix(m, "/") && ok && svc != "" && method != "" && !strings.Contains(method, "/")
}

// WithAdmission makes the server ask ctrl before running each request
// (unary calls and streams; a stream holds its permit while its handler
// runs, and gives it back before its record is finished, as a unary call does).
// A nil ctrl means no admission control, the default.
// ServerOptions also installs ctrl's tap handle unless WithoutAdmissionTap is
// given.
func WithAdmission(ctrl *admission.Controller) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.admission = ctrl })
}

// WithAttemptStore makes the server keep a record of every call of a method
// not declared NO_SIDE_EFFECTS (DESIGN.md §3.7): a try begins in the store
// before its handler runs, and a finished record answers every later try of
// the call (a SUCCEEDED unary record replays its response, decoded as the
// method's output type from the protobuf registry, which generated code
// fills; for a method the registry does not know, such as one served by a
// hand-written grpc.ServiceDesc, as the type its handler returned on this
// server, once a call of that method has succeeded here since the server
// started (at most 1,024 such methods): until then such a record is answered
// COMMITTED, RESPONSE_NOT_RETAINED); a recorded unary call's handler runs
// on a context detached from the client's cancellation, with deadline exactly
// the attempt deadline plus the clock skew, so that a try the client stopped
// waiting for still finishes and its record resolves. A recorded stream's
// handler is not detached: it talks to its client, so it keeps the client's
// cancellation and runs until min(grpc-timeout, attempt deadline + skew); its
// record is finished all the same when it returns. Register
// idempotency.NewAttemptService(store) on the same server so that owners can
// query the records. The store's policy must use the same clock skew as
// WithClockSkew (both default to 500 ms): the record's lease lasts until the
// attempt deadline plus the store's skew and the handler runs until the
// deadline plus the server's, so a larger server skew lets a record read
// ABANDONED while its handler still runs (its call then ends UNKNOWN). A
// store that tells its policy (a Policy() idempotency.Policy method, as
// both of tollgate's stores have) is checked: a different skew, or a
// WithMaxAttemptTime over its policy's MaxAttemptDeadline, is
// ErrInvalidOption (the default maximum attempt time is lowered to it).
// A nil store, or one holding a nil pointer (a typed nil), is
// ErrInvalidOption too: pass no WithAttemptStore for a server that keeps no
// records (unlike WithAdmission, whose nil means none).
func WithAttemptStore(store idempotency.Store) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.store, c.nilStore = store, store == nil })
}

// WithoutAdmissionTap keeps ServerOptions from installing the admission
// controller's tap handle. grpc-go allows one tap per server: a server with a
// tap of its own calls AdmissionTap, given the same options, from it. A
// server with no admission tap at all loses the tap's early refusals and its
// bound on streams whose client sends nothing (see AdmissionTap); the
// interceptor still bounds its own wait for a server-streaming call's
// request, when it receives it first (see WithoutStreamRequestFirst), by
// the deadline the handler would have.
func WithoutAdmissionTap() ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.admissionTap = false })
}

// WithoutStreamRequestFirst makes the stream interceptor leave a
// server-streaming call's request to its handler. By default, for a
// server-streaming call whose request type the protobuf registry knows, and
// which is recorded (an attempt store, and a method not declared
// NO_SIDE_EFFECTS) or meets an admission controller, the interceptor
// receives the one request before admission and the record, with the
// server's codec into that type, and hands it to the handler's first
// RecvMsg: a client that opens the stream and sends nothing then holds no
// slot, and a record's fingerprint covers the request. That needs the
// server's codec to decode the registry's type, a handler that receives it
// as that message (in any Go form: generated, APIv1, dynamic), and one that
// does not wait for its client before receiving. A server whose codec is
// forced to another representation (a pass-through proxy's raw frames,
// say), whose handlers read the request as another message, or whose
// handlers send first to a client that waits for them, passes this option:
// its server-streaming calls are then admitted when they open and recorded
// with a fingerprint of the method alone, as client-streaming and bidi
// calls are. Servers that share an attempt store must agree on this option:
// their fingerprints of the same server-streaming call differ, so a repeat
// landing on a server of the other kind is refused ATTEMPT_REQUEST_MISMATCH
// (as across the upgrade the README describes).
func WithoutStreamRequestFirst() ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.streamRequestFirst = false })
}

// WithTenant sets the function that names the caller's tenant: of every
// caller that is not a trusted peer, and of a trusted peer whose header
// names none (header field "n"; a tollgate origin never sends one, so the
// function names the tenant of every attempt minted by a client). A trusted
// peer's "n" is honoured as it is. Default: every caller is tenant "". A name that is not 1–64 characters of
// [A-Za-z0-9._:-] (a SPIFFE ID, an e-mail), or that starts with "h.", is
// used as "h." and 40 hex digits of its SHA-256, so it keeps its records
// apart and travels in the header; no name can pass for another's digest.
func WithTenant(f func(ctx context.Context) string) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.tenant = f })
}

// WithTrustedPeer sets the function that decides whether the caller is a
// trusted tollgate peer, whose header (attempt, deadline, units, tenant) is
// honoured. From an untrusted peer the header is ignored and the request
// starts a new attempt under this server's defaults. Default: no peer is
// trusted. See TrustAll and TrustLoopback.
func WithTrustedPeer(f func(ctx context.Context) bool) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.trusted = f })
}

// WithDefaultAllowance sets the units of an attempt that starts at this
// server (its caller is untrusted or does not speak tollgate). Default
// DefaultAllowance (4). Such a server is the attempt's origin, as an origin
// client is: its handler's own calls are the origin's tries, which are not
// charged, and the units bound the RPCs sent below them (by the servers
// those calls reach, at every tier). So a handler here may make any number
// of calls, each repeated as its policy says, while the attempt's calls
// below its callees add up to at most units. Negative units, or more than
// the maximum allowance (WithMaxAllowance), are ErrInvalidOption.
func WithDefaultAllowance(units int64) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.defaultAllowance, c.defaultAllowanceSet = units, true })
}

// WithMaxAllowance caps the units a caller may grant this server. Default
// DefaultMaxAllowance (100); at most 1,000,000. A maximum below the default
// allowance (WithDefaultAllowance, default 4) is ErrInvalidOption: lower
// that too.
func WithMaxAllowance(units int64) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.maxAllowance = units })
}

// WithMaxAttemptTime caps how far in the future an attempt's deadline may be
// when a request reaches this server, and is the deadline of a request that
// has none. Default DefaultMaxAttemptTime (30 s), or the attempt store's
// policy MaxAttemptDeadline when that is shorter; at most 24 h, and with a
// store that has a policy (idempotency's stores), at most its
// MaxAttemptDeadline: its records must outlive every attempt it accepts.
// The cap counts from each request's arrival, so a repeat gets a later one:
// a try that admission drops because it can no longer finish by the cap
// alone, a stream whose request arrives after the cap passed, or a try a
// store finds past it, is refused DEADLINE_EXPIRED not final while the
// caller's own deadline has not passed (the admission tap's bound on the
// stream's context is this cap, not the caller's deadline); a store's
// DEADLINE_UNREACHABLE (too little time to wait for replicas) under the cap
// is final only when a fresh cap, or the caller's deadline if earlier,
// could not fit the store's work either.
func WithMaxAttemptTime(d time.Duration) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.maxAttemptTime, c.maxAttemptTimeSet = d, true })
}

// WithClockSkew sets the largest difference assumed between trusted peers'
// clocks; a handler's deadline is at most the attempt deadline plus the skew.
// Default DefaultClockSkew (500 ms); at most 1 min.
func WithClockSkew(d time.Duration) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.skew = d })
}

// WithRecovery makes the server recover a handler's panic and answer it as
// an UNKNOWN outcome (INTERNAL), on the data path and on the control path
// (AttemptService, whose Store may panic, health, reflection). It covers
// the data path's own calls of the attempt store too: a Store whose Begin
// or Finish panics is answered as a store that failed (NOT_ADMITTED
// STORE_UNAVAILABLE before the handler ran, UNKNOWN after it). Without it,
// a panic is not recovered.
func WithRecovery() ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.recoverPanics = true })
}

// WithMaxRecvMsgSize sets grpc.MaxRecvMsgSize, which bounds the bytes a
// request may hold before interceptors see it (generated handlers decode
// first). Default DefaultMaxRecvMsgSize (4 MiB).
func WithMaxRecvMsgSize(n int) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.maxRecvMsgSize = n })
}

// WithMaxHeaderListSize sets grpc.MaxHeaderListSize, which bounds the bytes
// of a request's metadata (its header list, as HTTP/2 counts it): grpc-go
// refuses a request over it before any interceptor or handler runs.
// Admission's byte bounds count messages only, and grpc-go's own default
// is 16 MiB per request, so without this bound every request admitted or
// waiting could hold that much. Default DefaultMaxHeaderListSize (64 KiB);
// at least 1 KiB. Raise it for callers whose credentials or trace headers
// are larger. A tollgate client (DialOptions) whose request is over the
// limit the server advertised is refused by grpc-go before sending: its
// call ends NOT_ADMITTED, NOT_SENT, final, without a repeat.
func WithMaxHeaderListSize(n uint32) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.maxHeaderListSize = n })
}

// minHeaderListSize is the least WithMaxHeaderListSize accepts.
const minHeaderListSize = 1 << 10

// WithMaxConcurrentStreams sets grpc.MaxConcurrentStreams per connection.
// Default DefaultMaxStreams (1024), or, with WithAdmission, one more than
// the requests the admission controller holds at once
// (admission.Controller.Capacity: its classes' slots and queue items) when
// that is larger: each request admitted or waiting holds a stream of its
// connection, and a connection that the classes fill should keep one for
// the control path (AttemptService queries, which a tollgate client sends
// on the connection of the call they resolve, and health checks: DESIGN.md
// §3.12). An explicit n is used as given, even at or below that capacity
// (a per-connection bound behind a proxy that spreads calls over many
// connections is legitimate); then one connection whose calls fill it
// makes its control calls wait on the client for a stream. Even above it
// the room is not guaranteed: a request whose handler has ended gives its
// slot back before its record is finished, and keeps its stream until
// then, so a store slow to finish records can fill a connection's streams
// with no class full.
func WithMaxConcurrentStreams(n uint32) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.maxStreams, c.maxStreamsSet = n, true })
}

// WithServerMeterProvider sets the meter provider of the server's metrics.
// Default: the global provider, otel.GetMeterProvider(), read at
// construction: until a global provider is set, that is OpenTelemetry's
// delegating global, which forwards to the first provider set later, so a
// global provider set after construction is used too.
func WithServerMeterProvider(mp metric.MeterProvider) ServerOption {
	return serverOptionFunc(func(c *serverConfig) { c.meter = mp })
}

package admission

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ControlClass is the name of the built-in class that serves tollgate's
// AttemptService, gRPC health checks and server reflection (DESIGN.md §3.12).
// tollgate's server interceptor admits through it AttemptService queries
// and the late tries that only read their call's record ([Request].Control);
// health checks and control streams (a health Watch, a reflection session)
// bypass admission and take no slot.
// A [Class] of this name passed to [WithClasses] replaces its default limits.
const ControlClass = "control"

// DefaultClass is the name of the class New creates when no class is
// configured.
const DefaultClass = "default"

// controlPatterns are the methods the built-in control class serves.
// The control methods that tollgate's interceptor runs without a control
// slot, and that the tap therefore never refuses (see TapHandle): health,
// answered from memory, and reflection, whose sessions are streams that
// live as long as their client.
const (
	healthPrefix            = "/grpc.health.v1.Health/"
	reflectionV1Prefix      = "/grpc.reflection.v1.ServerReflection/"
	reflectionV1AlphaPrefix = "/grpc.reflection.v1alpha.ServerReflection/"
)

var controlPatterns = []string{
	"/tollgate.v1.AttemptService/",
	healthPrefix,
	reflectionV1Prefix,
	reflectionV1AlphaPrefix,
}

// slotless reports whether m is a control method the interceptor runs
// without a control slot.
func slotless(m string) bool {
	return strings.HasPrefix(m, healthPrefix) || strings.HasPrefix(m, reflectionV1Prefix) ||
		strings.HasPrefix(m, reflectionV1AlphaPrefix)
}

// Class is the plain configuration of one workload class: its reserved
// slots, its bounded queue and its per-tenant limits. A zero field means
// "none" or "off" as each field says; Slots must be at least 1.
type Class struct {
	// Name identifies the class in metrics, refusals and overrides: not
	// empty, at most MaxClassNameBytes, valid UTF-8 without control
	// characters.
	Name string
	// Slots is the number of requests of this class that may run at once on
	// its own reserved capacity. At least 1.
	Slots int
	// QueueItems bounds the requests waiting for a slot. 0: no waiting; a
	// request that finds no slot is refused with CONCURRENCY_FULL.
	QueueItems int
	// QueueBytes bounds the summed Request.Size of waiting requests (unknown
	// sizes count 0). 0: no byte bound. New refuses it on a class without a
	// queue (QueueItems 0).
	QueueBytes int64
	// MaxRequestBytes refuses requests larger than this with
	// REQUEST_TOO_LARGE before anything else is looked at. 0: no limit.
	MaxRequestBytes int
	// LendIdle lets requests of other classes run on this class's idle slots
	// when none of its own requests wait. A class never uses another's slots
	// unless that class lends them. Nothing is preempted: a lent slot comes
	// back when its borrower ends (a borrowing stream holds it for its
	// lifetime), and the lender's own requests wait for it meanwhile. A
	// class lends no more than its limits let it use: none while frozen or
	// shed (an Optional class while Degraded), at most its step while
	// Recovering or its lowered Slots under an override.
	LendIdle bool
	// Optional classes are shed (SHED) while the controller is degraded and
	// re-admitted in steps while it recovers; an optional class that lends
	// (LendIdle) lends nothing while shed. The control class cannot be
	// optional.
	Optional bool
	// ExpectedServiceTime seeds the learned service time of the class (its
	// mean and p95) until completed work replaces it. 0: unknown until the
	// first request of the class completes.
	ExpectedServiceTime time.Duration
	// MaxServiceTime caps every observed service time and so the learned
	// estimates. 0: [DefaultMaxServiceTime], or ExpectedServiceTime when
	// that is larger.
	MaxServiceTime time.Duration
	// TenantRunning bounds the requests of one tenant running in this class;
	// a request over it waits in the queue, or, in a class without a queue,
	// is refused with TENANT_LIMIT. 0: no limit.
	TenantRunning int
	// TenantQueued bounds the requests of one tenant waiting in this class;
	// a request over it is refused with TENANT_LIMIT. 0: no limit. New
	// refuses it on a class without a queue (QueueItems 0), where nothing
	// waits for it to bound.
	TenantQueued int
	// TenantQueueWork bounds the estimated work (learned mean service time
	// per request) of one tenant's waiting requests, as in seed 004's
	// tenant_queue_seconds; over it: TENANT_LIMIT — a tenant's only request
	// too, when the learned mean alone exceeds the bound (in a full class
	// that refusal counts as the class's overload). 0: no limit. New
	// refuses it on a class without a queue (QueueItems 0), where no tenant
	// has work waiting.
	TenantQueueWork time.Duration
}

// DefaultMaxServiceTime caps the learned service time of a class whose
// MaxServiceTime is 0, so that one hung handler cannot inflate the estimate
// without bound.
const DefaultMaxServiceTime = time.Minute

// maxServiceTime is the cap in force for the class's learned service time.
func (cl Class) maxServiceTime() time.Duration {
	if cl.MaxServiceTime > 0 {
		return cl.MaxServiceTime
	}
	return max(DefaultMaxServiceTime, cl.ExpectedServiceTime)
}

// MaxClassNameBytes is the longest class name New accepts: a refusal's
// detail carries the name, and tollgate's bound on what it sends
// (status.Bounded) drops a longer one.
const MaxClassNameBytes = 256

func (cl Class) validate() error {
	switch {
	case cl.Name == "":
		return invalidConfig("class with an empty name")
	case len(cl.Name) > MaxClassNameBytes:
		return invalidConfig("class name of %d bytes (%.40q…): at most %d, as refusals carry it", len(cl.Name), cl.Name, MaxClassNameBytes)
	case !utf8.ValidString(cl.Name) || strings.ContainsFunc(cl.Name, unicode.IsControl):
		// A refusal's detail carries the name as a protobuf string, which
		// is UTF-8: an invalid byte would come back as U+FFFD, another name.
		return invalidConfig("class name %q: must be valid UTF-8 without control characters, as refusals and metrics carry it", cl.Name)
	case cl.Slots < 1:
		return invalidConfig("class %q: Slots must be at least 1, got %d", cl.Name, cl.Slots)
	case cl.QueueItems < 0, cl.QueueBytes < 0, cl.MaxRequestBytes < 0,
		cl.TenantRunning < 0, cl.TenantQueued < 0, cl.TenantQueueWork < 0:
		return invalidConfig("class %q: negative limit", cl.Name)
	case cl.ExpectedServiceTime < 0 || cl.MaxServiceTime < 0:
		return invalidConfig("class %q: negative service time", cl.Name)
	case cl.MaxServiceTime > 0 && cl.ExpectedServiceTime > cl.MaxServiceTime:
		return invalidConfig("class %q: ExpectedServiceTime %v exceeds MaxServiceTime %v",
			cl.Name, cl.ExpectedServiceTime, cl.MaxServiceTime)
	case cl.Name == ControlClass && cl.Optional:
		return invalidConfig("the control class cannot be optional")
	case cl.TenantQueued > 0 && cl.QueueItems == 0:
		// No request of the class ever waits: the bound would bind nothing.
		return invalidConfig("class %q: TenantQueued %d bounds a queue the class does not have (QueueItems 0)", cl.Name, cl.TenantQueued)
	case cl.TenantQueueWork > 0 && cl.QueueItems == 0:
		// Nothing waits, so no tenant has queued work: the bound would only
		// rename a CONCURRENCY_FULL refusal TENANT_LIMIT.
		return invalidConfig("class %q: TenantQueueWork %v bounds a queue the class does not have (QueueItems 0)", cl.Name, cl.TenantQueueWork)
	case cl.QueueBytes > 0 && cl.QueueItems == 0:
		return invalidConfig("class %q: QueueBytes %d bounds a queue the class does not have (QueueItems 0)", cl.Name, cl.QueueBytes)
	}
	return nil
}

// Stage is a set of the admission stages that can be switched off. The
// slot-or-queue stage is always on: it is what bounds the work.
type Stage uint8

const (
	// StageSize refuses requests larger than the class's MaxRequestBytes
	// (REQUEST_TOO_LARGE).
	StageSize Stage = 1 << iota
	// StageTenant applies the classes' per-tenant limits (TENANT_LIMIT).
	StageTenant
	// StageDeadline refuses, on arrival, work whose deadline has passed
	// (DEADLINE_EXPIRED) or cannot be met after the predicted wait and the
	// learned service time (DEADLINE_UNREACHABLE).
	StageDeadline
	// StageDequeue re-checks the deadline when a waiting request would start
	// and drops it unrun (DEADLINE_EXPIRED) if it can no longer finish in time.
	StageDequeue
	// StageDegradation runs the Normal/Degraded/Recovering state machine and
	// sheds optional classes while degraded (SHED).
	StageDegradation

	// AllStages is the default: every stage on.
	AllStages = StageSize | StageTenant | StageDeadline | StageDequeue | StageDegradation
)

// Degradation configures the mode state machine (DESIGN.md §3.10). Time is
// cut into windows of length Window; a window is overloaded when, for the
// classes other than control, its refusals for lack of capacity or time
// (QUEUE_FULL, CONCURRENCY_FULL, DEADLINE_UNREACHABLE, DEADLINE_EXPIRED) reach
// MaxRefusalRatio of at least MinDecisions decisions (requests that arrive
// with their deadline passed, or too short even without waiting, are the
// caller's problem: they count in no window), or a request waited (or
// still waits at the window's end) MaxQueueAge or longer. Zero fields take
// the defaults named below.
type Degradation struct {
	// Window is the length of one observation window. Default 1s.
	Window time.Duration
	// EnterAfter is the number of consecutive overloaded windows that move
	// Normal to Degraded. Default 1.
	EnterAfter int
	// ExitAfter is the number of consecutive healthy windows that move
	// Degraded through Recovering back to Normal. Default 3. After falling
	// back from Recovering to Degraded, the controller stays Degraded for
	// ExitAfter healthy windows before it recovers again.
	ExitAfter int
	// MaxRefusalRatio is the refusal ratio that makes a window overloaded.
	// Default 0.5; negative: this signal is off.
	MaxRefusalRatio float64
	// MinDecisions is the least number of decisions in a window for the
	// refusal ratio to count. Default 20.
	MinDecisions int
	// MaxQueueAge makes a window overloaded when a request waited this long
	// in it: one that started, one still waiting when the window closes, or
	// one that left the queue unrun in it (its context ended, or it could
	// no longer finish by its deadline), its age counted up to when it left.
	// 0: this signal is off.
	MaxQueueAge time.Duration
}

func (d *Degradation) fill() error {
	if d.Window == 0 {
		d.Window = time.Second
	}
	if d.EnterAfter == 0 {
		d.EnterAfter = 1
	}
	if d.ExitAfter == 0 {
		d.ExitAfter = 3
	}
	if d.MaxRefusalRatio == 0 {
		d.MaxRefusalRatio = 0.5
	}
	if d.MinDecisions == 0 {
		d.MinDecisions = 20
	}
	switch {
	case d.Window < 0:
		return invalidConfig("degradation window must be positive")
	case d.EnterAfter < 0 || d.ExitAfter < 0 || d.MinDecisions < 0:
		return invalidConfig("degradation counts must not be negative")
	case !(d.MaxRefusalRatio <= 1): // NaN too
		return invalidConfig("MaxRefusalRatio %v above 1 or not a number", d.MaxRefusalRatio)
	case d.MaxQueueAge < 0:
		return invalidConfig("MaxQueueAge must not be negative")
	}
	return nil
}

// Option configures a [Controller] built by [New]. Options are values; New
// applies the defaults, then the options in order, then validates once.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	classes     []Class
	patterns    []pattern
	def         string
	classifier  func(context.Context, Request) string
	control     bool
	stages      Stage
	margin      time.Duration
	degradation Degradation
	maxTTL      time.Duration
	maxRA       time.Duration
	alpha       float64
	mp          metric.MeterProvider
	tp          trace.TracerProvider
	mpSet       bool // WithMeterProvider given (New refuses nil then)
	tpSet       bool // WithTracerProvider given (New refuses nil then)
	now         func() time.Time
	realClock   bool // now is time.Now: waiters' give-up timers may run
	observer    func(Event)
	check       func(error) // tests: invariant checker, called under the lock
	goneNoted   func()      // tests: called once a waiter's context's ending has been noted (noteGone)
}

type pattern struct {
	pat, class string
	none       bool // from a WithMethods call that gave no pattern: New refuses it
}

// WithClasses adds workload classes. The first class added is the default
// class unless [WithDefaultClass] names another. A class named
// [ControlClass] replaces the built-in control class's limits; it may not
// lend its slots or be optional.
func WithClasses(classes ...Class) Option {
	cl := append([]Class(nil), classes...)
	return optionFunc(func(c *config) { c.classes = append(c.classes, cl...) })
}

// WithMethods routes methods to a class. A pattern is a full method name
// ("/pkg.Service/Method"), a service ("/pkg.Service/", ending in a slash:
// every method of it) or a prefix ending in "*" ("/pkg.*"). Exact names win
// over services, services over prefixes; among prefixes the longest wins.
// New refuses a pattern of any other form (it would never match), a
// pattern routed to two classes, and one that matches only control methods
// (the control class serves them, unless WithoutControlClass); and a call
// with no pattern at all, which would route nothing.
func WithMethods(class string, patterns ...string) Option {
	ps := make([]pattern, 0, max(len(patterns), 1))
	for _, p := range patterns {
		ps = append(ps, pattern{pat: p, class: class})
	}
	if len(patterns) == 0 {
		ps = append(ps, pattern{class: class, none: true})
	}
	return optionFunc(func(c *config) { c.patterns = append(c.patterns, ps...) })
}

// WithDefaultClass names the class of requests no pattern or classifier
// places. Default: the first class given to [WithClasses]. New refuses
// [ControlClass]: it would send every unclassified data request into the
// small class that keeps the control path open under overload (DESIGN.md
// §3.12); route operator methods there with [WithMethods] instead.
func WithDefaultClass(name string) Option {
	return optionFunc(func(c *config) { c.def = name })
}

// WithClassifier places requests by a function of the request's context and
// the Request, for example a criticality propagated by trusted callers. It is
// consulted after the control methods (and requests marked [Request].Control)
// and before the method patterns; an
// empty or unknown class name falls through to the patterns. f must be safe
// for concurrent use and cheap: it runs on every Admit (never in the tap).
func WithClassifier(f func(ctx context.Context, r Request) string) Option {
	return optionFunc(func(c *config) { c.classifier = f })
}

// WithoutControlClass removes the built-in control class: AttemptService,
// health and reflection calls are then classified like any other method.
func WithoutControlClass() Option {
	return optionFunc(func(c *config) { c.control = false })
}

// WithStages sets which switchable stages run. Default [AllStages]; New
// refuses a set with a bit that is not one of the Stage constants.
func WithStages(s Stage) Option {
	return optionFunc(func(c *config) { c.stages = s })
}

// WithSafetyMargin adds d to the predicted finish time in the deadline
// stage. Default 0. Negative values are an error.
func WithSafetyMargin(d time.Duration) Option {
	return optionFunc(func(c *config) { c.margin = d })
}

// WithDegradation configures the degradation state machine; zero fields
// take their defaults. Without this option the defaults of [Degradation]
// apply; switch the stage off with [WithStages].
func WithDegradation(d Degradation) Option {
	return optionFunc(func(c *config) { c.degradation = d })
}

// WithMaxOverrideTTL bounds how long an operator override may last.
// Default one hour.
func WithMaxOverrideTTL(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxTTL = d })
}

// DefaultMaxRetryAfter bounds the retry-after of refusals unless
// [WithMaxRetryAfter] sets another bound.
const DefaultMaxRetryAfter = 30 * time.Second

// WithMaxRetryAfter bounds the retry-after a refusal suggests: every
// suggestion is less than d. A suggestion reflects the class's predicted
// wait, jittered in [½, 1½) of it; that base is capped at ⅔ of d, so a
// refusal whose predicted wait is long suggests a delay spread over
// [⅓ d, d) rather than one as long as the wait, which the queue will have
// changed long before (a repeat is refused cheaply if it has not). SHED
// suggests the time until the class can be admitted again, jittered above
// it, never before it, over half of the larger of that time and the
// degradation window (Degradation.Window), with the same cap (a time beyond
// ⅔ d suggests [⅔ d, d)).
// Default [DefaultMaxRetryAfter]; d must be at least a millisecond.
func WithMaxRetryAfter(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxRA = d })
}

// WithLearningRate sets the weight of a new observation in the learned mean
// service time (an exponentially weighted moving average). Default 0.2;
// must be in (0, 1].
func WithLearningRate(alpha float64) Option {
	return optionFunc(func(c *config) { c.alpha = alpha })
}

// WithMeterProvider sets where the controller's metrics go. Default: the
// global provider, otel.GetMeterProvider(), read when New runs: until a
// global provider is set, that is OpenTelemetry's delegating global, which
// forwards to the first provider set later, so a global provider set after
// New is used too. New refuses a nil mp (as tollgate's interceptor does):
// pass none for the global one, or a noop provider for no metrics.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp, c.mpSet = mp, true })
}

// WithTracerProvider sets where override and mode events go. Default: the
// global provider, otel.GetTracerProvider(), read when New runs (as
// WithMeterProvider's, a global provider set after New is used too). New
// refuses a nil tp, as it does a nil meter provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp, c.tpSet = tp, true })
}

// WithObserver calls f with every admission event (admitted, queued, started
// from the queue, refused, released, mode changed), synchronously, from the
// goroutine that caused it (a waiter started because an override expired or
// a window ended: the controller's timer's), after the controller's lock is
// released. f must
// be safe for concurrent use and must not block; nil removes the observer.
// A panic of f is recovered and counted (Stats.ObserverPanics), and the
// event it was given is lost: the controller and its caller go on as if f
// had returned (a permit is still the caller's, a slot still comes back).
// It is meant for logs, tests and simulations; metrics need no observer.
func WithObserver(f func(Event)) Option {
	return optionFunc(func(c *config) { c.observer = f })
}

// withClock makes the controller read time from now (tests; the exported
// …At methods serve simulations).
func withClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.now, c.realClock = now, false })
}

func newConfig(opts []Option) (*config, error) {
	c := &config{
		control:   true,
		stages:    AllStages,
		maxTTL:    time.Hour,
		maxRA:     DefaultMaxRetryAfter,
		alpha:     0.2,
		now:       time.Now,
		realClock: true,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	switch {
	case c.mpSet && c.mp == nil:
		return nil, invalidConfig("nil meter provider (pass no WithMeterProvider for the global one)")
	case c.tpSet && c.tp == nil:
		return nil, invalidConfig("nil tracer provider (pass no WithTracerProvider for the global one)")
	case c.stages&^AllStages != 0:
		return nil, invalidConfig("stages %#x include bits that are no Stage (AllStages is %#x)", uint8(c.stages), uint8(AllStages))
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.now == nil {
		c.now, c.realClock = time.Now, true
	}
	if err := c.degradation.fill(); err != nil {
		return nil, err
	}
	switch {
	case c.margin < 0:
		return nil, invalidConfig("negative safety margin")
	case c.maxTTL <= 0:
		return nil, invalidConfig("max override TTL must be positive")
	case c.maxRA < time.Millisecond:
		return nil, invalidConfig("max retry-after %v below a millisecond", c.maxRA)
	case !(c.alpha > 0 && c.alpha <= 1):
		return nil, invalidConfig("learning rate %v outside (0, 1]", c.alpha)
	}
	// Classes: user classes, then the control class (built in unless given).
	var classes []Class
	seen := map[string]bool{}
	var control *Class
	for _, cl := range c.classes {
		if err := cl.validate(); err != nil {
			return nil, err
		}
		if seen[cl.Name] {
			return nil, invalidConfig("class %q configured twice", cl.Name)
		}
		seen[cl.Name] = true
		if cl.Name == ControlClass {
			cc := cl
			control = &cc
			continue
		}
		classes = append(classes, cl)
	}
	if len(classes) == 0 {
		classes = append(classes, Class{Name: DefaultClass, Slots: 64, QueueItems: 256})
	}
	if c.def == "" {
		c.def = classes[0].Name
	}
	if control != nil && (control.LendIdle || control.Optional) {
		// The control class keeps observation and recovery answering
		// while every other class is saturated (DESIGN.md §3.12): data
		// traffic must not borrow its slots, nor may it be shed.
		return nil, invalidConfig("class %q cannot lend its slots or be optional", ControlClass)
	}
	if c.control || control != nil {
		if control == nil {
			control = &Class{Name: ControlClass, Slots: 2, QueueItems: 8}
		}
		// The control class comes first so a freed lender slot serves it first.
		classes = append([]Class{*control}, classes...)
	}
	c.classes = classes
	names := map[string]bool{}
	for _, cl := range classes {
		names[cl.Name] = true
	}
	if !names[c.def] {
		return nil, invalidConfig("default class %q is not configured", c.def)
	}
	if c.def == ControlClass {
		return nil, invalidConfig("default class %q: every unclassified data request would take the control path's slots; route operator methods there with WithMethods", ControlClass)
	}
	routed := map[string]string{} // pattern → class
	for _, p := range c.patterns {
		if p.none {
			return nil, invalidConfig("WithMethods(%q) with no pattern routes nothing", p.class)
		}
		if !names[p.class] {
			return nil, invalidConfig("pattern %q names unknown class %q", p.pat, p.class)
		}
		if !strings.HasPrefix(p.pat, "/") {
			return nil, invalidConfig("pattern %q must start with \"/\"", p.pat)
		}
		if err := validPattern(p.pat); err != nil {
			return nil, err
		}
		if other, ok := routed[p.pat]; ok && other != p.class {
			return nil, invalidConfig("pattern %q routed to both class %q and class %q", p.pat, other, p.class)
		}
		routed[p.pat] = p.class
		if c.control && p.class != ControlClass && isControl(strings.TrimSuffix(p.pat, "*")) {
			// classify places control methods first: the pattern would
			// never match.
			return nil, invalidConfig("pattern %q of class %q matches only control methods, which the control class serves (WithoutControlClass classifies them like others)", p.pat, p.class)
		}
	}
	if names[ControlClass] && c.control {
		ps := make([]pattern, 0, len(controlPatterns)+len(c.patterns))
		for _, p := range controlPatterns {
			ps = append(ps, pattern{pat: p, class: ControlClass})
		}
		c.patterns = append(ps, c.patterns...)
	}
	return c, nil
}

// validPattern refuses a pattern that could never match a method name as
// WithMethods reads it: a "*" anywhere but at its end, or, without one, a
// name that is neither a service ("/pkg.Service/") nor a full method
// ("/pkg.Service/Method").
func validPattern(pat string) error {
	if i := strings.IndexByte(pat, '*'); i >= 0 && i != len(pat)-1 {
		return invalidConfig("pattern %q: \"*\" may only end a pattern", pat)
	}
	if strings.HasSuffix(pat, "*") || strings.HasSuffix(pat, "/") && strings.Count(pat, "/") == 2 {
		return nil
	}
	if svc, method, ok := strings.Cut(pat[1:], "/"); !ok || svc == "" || method == "" || strings.Contains(method, "/") {
		return invalidConfig("pattern %q is neither a full method (\"/pkg.Service/Method\"), a service (\"/pkg.Service/\") nor a prefix ending in \"*\"", pat)
	}
	return nil
}

// ErrInvalidConfig is wrapped by every error [New] returns for a
// configuration it refuses: a class, degradation setting or option that
// cannot mean anything.
var ErrInvalidConfig = errors.New("admission: invalid configuration")

func invalidConfig(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

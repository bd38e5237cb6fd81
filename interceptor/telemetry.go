package interceptor

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// instrumentationName names tollgate's tracer and meter.
const instrumentationName = "github.com/tollgate-go/tollgate/interceptor"

// Attribute keys of DESIGN.md §5. No tenant or attempt ID is ever a metric
// label; they appear only on spans.
const (
	attrAttemptID = attribute.Key("tollgate.attempt.id")
	attrCall      = attribute.Key("tollgate.call")
	attrTry       = attribute.Key("tollgate.try")
	attrGranted   = attribute.Key("tollgate.allowance.granted")
	attrSpent     = attribute.Key("tollgate.allowance.spent")
	attrOutcome   = attribute.Key("tollgate.outcome")
	attrReason    = attribute.Key("tollgate.reason")
	attrClass     = attribute.Key("tollgate.class")
	attrHeld      = attribute.Key("tollgate.allowance.held")
	attrQueries   = attribute.Key("tollgate.queries")

	// The OTel RPC semantic conventions' names of a call's method, and of a
	// failed query's gRPC code.
	attrRPCService = attribute.Key("rpc.service")
	attrRPCMethod  = attribute.Key("rpc.method")
	attrRPCCode    = attribute.Key("rpc.grpc.status_code")

	eventSpend     = "tollgate.allowance.spend"
	eventRetry     = "tollgate.retry"
	eventQuery     = "tollgate.attempt.query"
	eventAdmission = "tollgate.admission"
	eventRefusal   = "tollgate.refusal"

	attrUnits       = attribute.Key("units")
	attrRemaining   = attribute.Key("remaining")
	attrDelay       = attribute.Key("delay") // in milliseconds
	attrEventReason = attribute.Key("reason")
	attrState       = attribute.Key("state")
	attrDecision    = attribute.Key("decision")
	attrQueuedAhead = attribute.Key("queued_ahead")
	attrEventClass  = attribute.Key("class")
)

// attrRPCSystem is rpc.system of every tollgate.call span.
var attrRPCSystem = attribute.String("rpc.system", "grpc")

// maxQueryEvents is how many resolution queries of one call get a
// tollgate.attempt.query event each; after them only the last query of
// each resolution does (the answer the owner acted on), so that a long poll
// cannot push the call's span past the SDK's limit of events per span
// (128 by default), which drops the newest. tollgate.queries on the span
// counts every query that may have been sent.
const maxQueryEvents = 16

// clientTelemetry is what the client interceptors record with, built once.
type clientTelemetry struct {
	tracer          trace.Tracer
	exhausted       metric.Int64Counter
	tries           metric.Int64Counter
	budgetExhausted metric.Int64Counter
	spent           metric.Int64Counter
	held            metric.Int64Counter
	reconciled      metric.Int64Counter
	queries         metric.Int64Counter
}

func newClientTelemetry(c *clientConfig) (*clientTelemetry, error) {
	m := c.meter.Meter(instrumentationName)
	exhausted, err := m.Int64Counter("tollgate.allowance.exhausted",
		metric.WithDescription("Calls refused locally because the attempt's allowance had no free unit."),
		metric.WithUnit("{call}"))
	if err != nil {
		return nil, err
	}
	tries, err := m.Int64Counter("tollgate.client.tries",
		metric.WithDescription("Tries sent by tollgate's client interceptor, by outcome."),
		metric.WithUnit("{try}"))
	if err != nil {
		return nil, err
	}
	budgetExhausted, err := m.Int64Counter("tollgate.retry_budget.exhausted",
		metric.WithDescription("Repeats or resolutions refused because the target's retry budget had no token."),
		metric.WithUnit("{call}"))
	if err != nil {
		return nil, err
	}
	spent, err := m.Int64Counter("tollgate.allowance.spent",
		metric.WithDescription("Units of attempts' allowances spent: one per try sent below the origin (a try that never left the client gives its unit back)."),
		metric.WithUnit("{unit}"))
	if err != nil {
		return nil, err
	}
	held, err := m.Int64Counter("tollgate.allowance.held",
		metric.WithDescription("Units of grants held because a try's ending proved nothing of what its callee spent: they count as spent until a finished record of the call reconciles them, or for good once the ledger is sealed."),
		metric.WithUnit("{unit}"))
	if err != nil {
		return nil, err
	}
	reconciled, err := m.Int64Counter("tollgate.allowance.reconciled",
		metric.WithDescription("Units of held grants settled by a finished record of their call (or by the status a released stream's try ended with), spent or freed as it says: tollgate.allowance.held minus this is what stays held, or was sealed as spent while held."),
		metric.WithUnit("{unit}"))
	if err != nil {
		return nil, err
	}
	queries, err := m.Int64Counter("tollgate.client.queries",
		metric.WithDescription("Resolution queries (FenceAttempt) that tollgate's client interceptor may have sent (not one that provably never left the client), by the state they read, or QUERY_FAILED."),
		metric.WithUnit("{query}"))
	if err != nil {
		return nil, err
	}
	return &clientTelemetry{
		tracer:          c.tracer.Tracer(instrumentationName),
		exhausted:       exhausted,
		tries:           tries,
		budgetExhausted: budgetExhausted,
		spent:           spent,
		held:            held,
		reconciled:      reconciled,
		queries:         queries,
	}, nil
}

// serverTelemetry is what the server interceptors record with, built once.
type serverTelemetry struct {
	malformed metric.Int64Counter
	// late counts the tries refused DEADLINE_EXPIRED because they came
	// after their attempt's deadline (plus the skew) with no record to
	// answer them, or whose context ended while the record that could
	// have answered them was looked up, or (a stream received first) whose
	// request had not come when a deadline ended them (stage arrival:
	// noRequest), and the recorded
	// tries that came in time and whose deadline passed while their record
	// was begun (stage begin): the interceptor
	// refuses the first before admission and the second after it, so the
	// controller's own tollgate.deadline.misses never sees them (a late
	// try's lookup permit is released with ReleaseMissCounted, or
	// abandoned, once the try is counted here: endLookup).
	late metric.Int64Counter
	// refusals counts the tries the interceptor refused after admission
	// (refused), by reason.
	refusals metric.Int64Counter
}

// arrivalStage and beginStage are the stage attributes of the late tries'
// count.
var (
	arrivalStage = metric.WithAttributeSet(attribute.NewSet(attribute.String("stage", "arrival")))
	beginStage   = metric.WithAttributeSet(attribute.NewSet(attribute.String("stage", "begin")))
)

func newServerTelemetry(c *serverConfig) (*serverTelemetry, error) {
	m := c.meter.Meter(instrumentationName)
	malformed, err := m.Int64Counter("tollgate.metadata.malformed",
		metric.WithDescription("Requests whose tollgate header was malformed, by whether the peer was trusted."),
		metric.WithUnit("{request}"))
	if err != nil {
		return nil, err
	}
	// The admission controller records the other stages in its own scope;
	// the description and unit are admission's, word for word (its
	// metrics.go), so that an exporter that merges the two by name
	// (Prometheus keeps one help text) finds no conflict.
	late, err := m.Int64Counter("tollgate.deadline.misses",
		metric.WithDescription("Deadlines missed, by stage: arrival (a try that came after its attempt's deadline, or a server-streaming try whose one request did not come by its deadline, refused by the server interceptor before admission), begin (a recorded try whose deadline passed while the server interceptor began its record, before its handler ran), admission (arrived expired), dequeue (expired while waiting, dropped unrun), run (finished late)."),
		metric.WithUnit("{request}"))
	if err != nil {
		return nil, err
	}
	refusals, err := m.Int64Counter("tollgate.server.refusals",
		metric.WithDescription("Tries the server interceptor refused after admission, before their handler ran (the request could not be fingerprinted, the record store refused or failed, or the call's record answered with a refusal), by reason."),
		metric.WithUnit("{request}"))
	if err != nil {
		return nil, err
	}
	return &serverTelemetry{malformed: malformed, late: late, refusals: refusals}, nil
}

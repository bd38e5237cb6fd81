package interceptor

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// newServer builds the server interceptors' shared state: defaults, then
// opts, then one validation pass.
func newServer(opts []ServerOption) (*server, error) {
	cfg := defaultServerConfig()
	for _, o := range opts {
		if o != nil {
			o.applyServer(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tel, err := newServerTelemetry(&cfg)
	if err != nil {
		return nil, fmt.Errorf("interceptor: server telemetry: %w", err)
	}
	return &server{cfg: cfg, tel: tel}, nil
}

// newClient builds the client interceptors' shared state. statsInstalled
// says the stats handler is installed beside them (DialOptions), so a try
// without OutHeader was never sent.
func newClient(opts []ClientOption, statsInstalled bool) (*client, error) {
	cfg := defaultClientConfig()
	for _, o := range opts {
		if o != nil {
			o.applyClient(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tel, err := newClientTelemetry(&cfg)
	if err != nil {
		return nil, fmt.Errorf("interceptor: client telemetry: %w", err)
	}
	c := &client{cfg: cfg, tel: tel, statsInstalled: statsInstalled, policies: map[string]*RetryPolicy{}}
	for m, p := range cfg.methodRetry {
		c.policies[m] = &p
	}
	return c, nil
}

// NewServerInterceptors returns tollgate's server interceptors as plain grpc
// types, for a server that places them itself in its chain (ServerOptions
// chains them where its options stand among the server's options: an
// interceptor given before them runs outside tollgate's). Admission's tap, grpc.MaxRecvMsgSize and
// grpc.MaxConcurrentStreams are then the caller's to install (see
// AdmissionTap and ServerOptions). Both share one state; they are safe for
// concurrent use. An invalid option is an error wrapping ErrInvalidOption.
func NewServerInterceptors(opts ...ServerOption) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor, error) {
	sv, err := newServer(opts)
	if err != nil {
		return nil, nil, err
	}
	return sv.unary, sv.stream, nil
}

// NewClientInterceptors returns tollgate's client interceptors as plain grpc
// types, for a client that places them itself in its chain. DialOptions is
// the simpler way: it also installs StatsHandler (without it, a try that was
// never sent cannot be told from one that may have been, and is treated as
// maybe sent: its outcome UNKNOWN, its grant held) and grpc.WithDisableRetry
// (without it a service config's retry policy would be a second retry loop).
// Both interceptors share one state (retry budgets per target); they are
// safe for concurrent use. An invalid option is an error wrapping
// ErrInvalidOption.
func NewClientInterceptors(opts ...ClientOption) (grpc.UnaryClientInterceptor, grpc.StreamClientInterceptor, error) {
	c, err := newClient(opts, false)
	if err != nil {
		return nil, nil, err
	}
	return c.unary, c.stream, nil
}

// StatsHandler returns the client stats handler that tells tollgate's client
// interceptors whether a try's request was sent (OutHeader) and whether the
// peer's status arrived (InTrailer), with its tollgate-spent and
// grpc-retry-pushback-ms trailers. DialOptions installs it; install it with
// grpc.WithStatsHandler beside NewClientInterceptors. It keeps no state.
func StatsHandler() stats.Handler { return statsHandler{} }

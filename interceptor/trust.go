package interceptor

import (
	"context"
	"net"

	"google.golang.org/grpc/peer"
)

// TrustAll trusts every peer. Use it only where the transport already
// authenticates callers as tollgate peers of the same deployment (for example
// a mesh with mutual TLS and no external ingress). Mutual TLS alone is not
// enough when outside callers hold client certificates too (customers of a
// public API): each would choose its tenant, attempt and units; check the
// peer's identity with a function of your own instead.
func TrustAll(context.Context) bool { return true }

// TrustLoopback trusts peers connected over a loopback address (127.0.0.0/8
// or ::1): processes on the same machine. Peers on a Unix socket are not
// trusted (they have no IP address). Do not use it where anything on the
// machine forwards outside traffic to the server: a local proxy or
// service-mesh sidecar (Envoy connects from 127.0.0.6, say), `kubectl
// port-forward` (it arrives from 127.0.0.1 inside the pod), an `ssh -L`
// tunnel: every caller forwarded, external ones included, would then be
// trusted with its header's attempt, deadline, units and tenant.
func TrustLoopback(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return false
	}
	switch a := p.Addr.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	default:
		host, _, err := net.SplitHostPort(a.String())
		if err != nil {
			return false
		}
		ip := net.ParseIP(host)
		return ip != nil && ip.IsLoopback()
	}
}

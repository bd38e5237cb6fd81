package interceptor

import (
	"context"
	"net"

	"google.golang.org/grpc/peer"
)

// TrustAll trusts every peer. Use it only where the transport already
// authenticates callers as tollgate peers of the same deployment (for example
// a mesh with mutual TLS and no external ingress).
func TrustAll(context.Context) bool { return true }

// TrustLoopback trusts peers connected over a loopback address (127.0.0.0/8
// or ::1): processes on the same machine.
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

// Package admission decides, cheaply and early, whether a server takes a
// request: reserved slots and bounded queues per workload class,
// deadline-aware admission, tenant limits and degradation with hysteresis.
//
// This file fixes the API the interceptor package calls; the implementation
// is being written (see issue 6).
package admission

import (
	"context"
	"time"
)

// Request is what the controller knows of a request when it decides.
type Request struct {
	// Method is the full gRPC method name, "/pkg.Service/Method".
	Method string
	// Tenant is the caller's tenant as the interceptor resolved it; "" for none.
	Tenant string
	// Size is the request's size in bytes; negative when unknown (streams).
	Size int
	// Deadline is the time by which the work must finish; zero for none.
	Deadline time.Time
}

// Permit is the right to run one admitted request. Release it exactly once,
// when the work ends.
type Permit struct {
	c *Controller
}

// Release returns the permit's slot. Calling it more than once does nothing.
func (p *Permit) Release() {}

// Controller admits requests. It is safe for concurrent use.
type Controller struct{}

// Admit decides whether r may run, waiting in its class's bounded queue when
// no slot is free. It returns a permit, or a NOT_ADMITTED error built by the
// status package (QUEUE_FULL, CONCURRENCY_FULL, DEADLINE_UNREACHABLE,
// DEADLINE_EXPIRED, SHED, TENANT_LIMIT, REQUEST_TOO_LARGE), or ctx's error
// wrapped as NOT_ADMITTED when ctx ends while the request waits.
func (c *Controller) Admit(ctx context.Context, r Request) (*Permit, error) {
	return &Permit{c: c}, nil
}

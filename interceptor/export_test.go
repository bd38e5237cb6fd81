package interceptor

import (
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// WithClientClock is withClientClock, for the black-box tests.
var WithClientClock = withClientClock

// BeforeHorizonRefusal is the refusal a default server gives try 1 of call
// "0" when its store can vouch for attempts only from verifiableFrom: a
// store's answer no black-box test can steer to any time it likes.
func BeforeHorizonRefusal(verifiableFrom time.Time) error {
	sv, err := newServer(nil)
	if err != nil {
		panic(err)
	}
	s := &attemptState{Attempt: Attempt{ID: "a", Call: "0", Try: 1}}
	return sv.beforeHorizon(s, status.WithAttempt(s.ID, s.Call, s.Try), verifiableFrom)
}

// QueueDelay is the retry-after a server with admission ctrl gives a try
// that admission dropped for the try's own deadline while its attempt's has
// not passed (tryDeadlineOnly): a refusal no black-box test can time.
func QueueDelay(ctrl *admission.Controller, class string) time.Duration {
	sv, err := newServer([]ServerOption{WithAdmission(ctrl)})
	if err != nil {
		panic(err)
	}
	return sv.queueDelay(class)
}

// MaxStreams is the grpc.MaxConcurrentStreams bound NewServerOptions(opts...)
// sets: an option grpc-go keeps opaque.
func MaxStreams(opts ...ServerOption) uint32 {
	sv, err := newServer(opts)
	if err != nil {
		panic(err)
	}
	return sv.cfg.maxStreams
}

package interceptor

import (
	"time"

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

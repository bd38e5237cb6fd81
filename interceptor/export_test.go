package interceptor

// WithClientClock is withClientClock, for the black-box tests.
var WithClientClock = withClientClock

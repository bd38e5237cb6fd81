// Package hooks lets tollgate's own tests reach options that the idempotency
// packages keep unexported, such as the clock. It is not an API.
package hooks

import "time"

// MemoryClock returns an idempotency.MemoryOption that makes a memory store
// read time from now. Set by package idempotency's init.
var MemoryClock func(now func() time.Time) any

// RedisClock returns a redisstore.Option that makes a Redis store read time
// from now. Set by package redisstore's init.
var RedisClock func(now func() time.Time) any

// RedisKeep returns a redisstore.Option that sets how long records are kept
// past their expiry (redisstore.DefaultKeep). Set by package redisstore's
// init.
var RedisKeep func(keep time.Duration) any

// RedisFailedBeginFenceTimeout returns a redisstore.Option that sets how
// long the fence a failed Begin sends may take (100 ms in production): a
// test that checks the fence ends the try gives it the time a loaded
// machine needs to dial and run one script. Set by package redisstore's
// init.
var RedisFailedBeginFenceTimeout func(d time.Duration) any

// RedisClockRecheckAfter returns a redisstore.Option that sets how long a
// Redis node's passed check vouches for it before the store reads its
// clock again (a minute in production): a test of the periodic check
// shortens it (it must be positive). Set by package redisstore's init.
var RedisClockRecheckAfter func(d time.Duration) any

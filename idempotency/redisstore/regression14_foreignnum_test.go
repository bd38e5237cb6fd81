package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
)

// A review found that load() promised that a hash at a record key that this store did not
// write — "a number that does not read" among them — is an error, never a
// refusal. It checks numbers with Lua's tonumber, which reads "inf", "nan",
// "0x10" and "1e3", none of which the store writes (n() formats %d) and
// none of which decode's strconv.ParseInt reads. A foreign hash whose lease
// and expiry are "inf" is taken for a try IN_PROGRESS for ever: every Begin
// of the key is refused ATTEMPT_IN_PROGRESS, with a record that has no
// lease (decode read "inf" as 0), instead of failing.
func TestRegression14RedisForeignNumberReadAsRecord(t *testing.T) {
	c, s, clock, k, rk := atRecordKey(t)
	ctx := context.Background()
	require.NoError(t, c.HSet(ctx, rk, "st", "2", "fp", "", "try", "1", "fen", "0", "code", "0", "msg", "", "det", "",
		"resp", "", "ret", "0", "units", "0", "sa", "0", "fa", "0", "lease", "inf",
		"dl", "0", "exp", "inf").Err())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.Error(t, err, "a foreign hash answered as a refusal: %v, record %v", res.Refusal, res.Record)
}

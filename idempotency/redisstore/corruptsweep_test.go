package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// recordFields are the fields of a record hash, as the scripts write them.
var recordFields = []string{"st", "fp", "try", "fen", "code", "msg", "det", "resp", "ret", "units", "sa", "fa", "lease", "dl", "exp", "tok", "ftok"}

// Every field of a SUCCEEDED record, deleted or overwritten with values no
// script writes there (and some it writes elsewhere), must never make the
// key read as absent: Get never answers UNSEEN, a fence never lays a
// tombstone over it, and try 2 begins only over what reads as a tombstone
// that lets it (DESIGN §3.7: a hash the store cannot read is an error, not
// an absence). It sweeps what load() checks, field by field.
func TestCorruptFieldNeverReadsAsAbsent(t *testing.T) {
	c, s, clock, k0, rk0 := atRecordKey(t)
	ctx := context.Background()
	prefix := rk0[:len(rk0)-len("r|"+k0.AttemptID+"|0|/x.Y/Z")]
	// <fa+N> is the record's own fa plus N ms.
	values := []string{"", "0", "1", "-1", "2", "5", "6", "1e3", "0x10", " 1", "1.5", "inf", "-inf", "nan", "abc",
		"99999999999999999999", "9007199254740993", "<fa+0>", "<fa+-1>", "<fa+1>", "<fa+10>"}
	i := 0
	for _, field := range recordFields {
		for _, val := range append(values, "<deleted>") {
			i++
			k := k0
			k.Call = strconv.Itoa(i)
			rk := prefix + "r|" + k.AttemptID + "|" + k.Call + "|" + k.Method
			what := fmt.Sprintf("field %s = %q", field, val)
			succeedDone(t, s, clock, k)
			var n int64
			if _, err := fmt.Sscanf(val, "<fa+%d>", &n); err == nil {
				fa, err := c.HGet(ctx, rk, "fa").Int64()
				require.NoError(t, err)
				val = strconv.FormatInt(fa+n, 10)
			}
			if val == "<deleted>" {
				require.NoError(t, c.HDel(ctx, rk, field).Err())
			} else {
				require.NoError(t, c.HSet(ctx, rk, field, val).Err())
			}

			clock.Advance(2 * time.Millisecond) // an exp just after the write has passed

			rec, err := s.Get(ctx, k)
			if err == nil {
				require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState(), what)
			}
			tomb := err == nil && rec.GetState() == tollgatev1.AttemptState_ATTEMPT_STATE_FENCED
			frec, err := s.Fence(ctx, k, 1)
			if err == nil && frec.GetState() == tollgatev1.AttemptState_ATTEMPT_STATE_FENCED {
				require.True(t, tomb, "%s: a fence laid a tombstone over a record that did not read as one", what)
			}
			res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
			if err == nil && res.Started {
				require.True(t, tomb, "%s: try 2 began over a record that did not read as a tombstone", what)
			}
		}
	}
}

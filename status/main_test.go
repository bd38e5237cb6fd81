package status_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// onWire is what a client receives for err: the status grpc-go would send,
// marshalled as grpc-status-details-bin and read back, with its details.
type onWire struct {
	st        *grpcstatus.Status
	detail    *tollgatev1.OutcomeDetail
	errorInfo *errdetails.ErrorInfo
	retryInfo *errdetails.RetryInfo
	others    int // details of any other type
}

func sendOverWire(t testing.TB, err error) onWire {
	t.Helper()
	st, ok := grpcstatus.FromError(err)
	require.True(t, ok, "no gRPC status in %v", err)
	b, merr := proto.Marshal(st.Proto())
	require.NoError(t, merr, "grpc-go would drop every detail of a status that does not marshal")
	var p spb.Status
	require.NoError(t, proto.Unmarshal(b, &p))
	w := onWire{st: grpcstatus.FromProto(&p)}
	for _, d := range w.st.Details() {
		switch v := d.(type) {
		case *tollgatev1.OutcomeDetail:
			require.Nil(t, w.detail, "two OutcomeDetails")
			w.detail = v
		case *errdetails.ErrorInfo:
			require.Nil(t, w.errorInfo, "two ErrorInfos")
			w.errorInfo = v
		case *errdetails.RetryInfo:
			require.Nil(t, w.retryInfo, "two RetryInfos")
			w.retryInfo = v
		case error:
			t.Fatalf("detail does not decode: %v", v)
		default:
			w.others++
		}
	}
	return w
}

// cmpDiff is empty when want and got are equal protobuf messages, and shows
// both otherwise. It stands in for protocmp, which needs
// github.com/google/go-cmp in go.mod.
func cmpDiff(want, got proto.Message) string {
	if proto.Equal(want, got) {
		return ""
	}
	return "want: {" + prototext.Format(want) + "}\ngot:  {" + prototext.Format(got) + "}"
}

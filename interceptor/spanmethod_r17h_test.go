package interceptor_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
)

// TestR17hCallSpanNamesAMethodWithoutItsLeadingSlash: grpc-go passes the
// method a caller gives ClientConn.Invoke to the interceptors as it is,
// and a name without its leading slash ("pkg.Service/Method") is one a
// caller can give. The tollgate.call span's rpc.service must still be the
// service's whole name: splitMethod cut its first character, taking the
// slash to be there.
func TestR17hCallSpanNamesAMethodWithoutItsLeadingSlash(t *testing.T) {
	tp, spans := testTracer(t)
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{GetFunc: okGet}).Register, serverOpts()...)
	conn := end.DialT(t, interceptor.DialOptions(interceptor.WithClientTracerProvider(tp),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...)
	_ = conn.Invoke(t.Context(), "tollgate.testing.v1.TestService/Get", &testingv1.GetRequest{}, &testingv1.GetResponse{})

	got := callSpans(spans)
	require.Len(t, got, 1)
	service, _ := attr(got[0].Attributes, "rpc.service")
	method, _ := attr(got[0].Attributes, "rpc.method")
	require.Equal(t, "tollgate.testing.v1.TestService", service.AsString())
	require.Equal(t, "Get", method.AsString())
}

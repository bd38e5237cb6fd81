package interceptor_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A user copying the interceptor package's Example could not compile it: it
// imported internal/testsvc and internal/testproto, which no program outside
// the module may import. Every Example of a public package must use public
// packages only (CONVENTIONS §8: runnable examples).
func TestR18iExamplesImportNoInternalPackage(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	var bad []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "internal" || strings.HasPrefix(d.Name(), ".") || d.Name() == "tools" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		hasExample := false
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") {
				hasExample = true
			}
		}
		if !hasExample {
			return nil
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
				bad = append(bad, rel+" imports "+p)
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, bad, "an Example a user cannot compile")
}

// WithMaxAllowance(0) alone was refused as "default allowance 4 outside [0,
// maximum allowance 0]", blaming an option the caller never set. The error
// says the maximum is below the default and names WithDefaultAllowance.
func TestR18iMaxAllowanceBelowDefaultNamesTheFix(t *testing.T) {
	_, err := interceptor.NewServerOptions(interceptor.WithMaxAllowance(0))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption)
	require.ErrorContains(t, err, "maximum allowance 0 is below the default allowance 4")
	require.ErrorContains(t, err, "WithDefaultAllowance")

	// Both set, the default above the maximum: the message names both.
	_, err = interceptor.NewServerOptions(interceptor.WithMaxAllowance(2), interceptor.WithDefaultAllowance(3))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption)
	require.ErrorContains(t, err, "default allowance 3 above the maximum allowance 2")

	_, err = interceptor.NewServerOptions(interceptor.WithMaxAllowance(0), interceptor.WithDefaultAllowance(0))
	require.NoError(t, err)
}

// Call-key errors named the internal package ("callkey: explicit name must
// be …"), and the local refusal carried it on the wire ("tollgate: not
// admitted: malformed header: callkey: …"). They name the public concept:
// interceptor's call key.
func TestR18iCallKeyErrorsNameNoInternalPackage(t *testing.T) {
	err := interceptor.ValidCallKey("a.b")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "callkey")
	require.True(t, strings.HasPrefix(err.Error(), `interceptor: call key "a.b"`), err.Error())
	require.Contains(t, err.Error(), "[A-Za-z0-9_:-]")

	// A bad name at the origin, and a key grown too long under a parent
	// inside a handler: both refused locally, MALFORMED_HEADER.
	downstream := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{}).Register,
		interceptor.ServerOptions(interceptor.WithTrustedPeer(interceptor.TrustAll))...)
	down := testingv1.NewTestServiceClient(downstream.DialT(t, interceptor.DialOptions()...))
	inner := make(chan error, 1)
	upstream := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		_, err := down.Get(interceptor.WithCallKey(ctx, "x"), &testingv1.GetRequest{Key: "k"})
		inner <- err
		return &testingv1.GetResponse{}, nil
	}}).Register, interceptor.ServerOptions(interceptor.WithTrustedPeer(interceptor.TrustAll))...)
	up := testingv1.NewTestServiceClient(upstream.DialT(t, interceptor.DialOptions(interceptor.WithAttemptTimeout(time.Minute))...))

	_, err = up.Get(interceptor.WithCallKey(context.Background(), "a.b"), &testingv1.GetRequest{Key: "k"})
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonMalformedHeader, o.Reason, "%v", err)
	require.NotContains(t, err.Error(), "callkey")
	require.Contains(t, err.Error(), "interceptor: call key")

	// The origin's explicit key is the name itself, 128 characters: the
	// handler's call under it ("<128>.x") is too long.
	_, err = up.Get(interceptor.WithCallKey(context.Background(), strings.Repeat("n", 128)), &testingv1.GetRequest{Key: "k"})
	require.NoError(t, err)
	err = <-inner
	require.Equal(t, status.ReasonMalformedHeader, status.OutcomeOf(err).Reason, "%v", err)
	require.NotContains(t, err.Error(), "callkey")
	require.Contains(t, err.Error(), "interceptor: call key")
}

// WithHopMargin(time.Hour) with WithAttemptTimeout(time.Second) was
// accepted, and every call the client then started was refused locally
// DEADLINE_UNREACHABLE. A hop margin and minimum try time that leave no
// time in the client's own attempts are ErrInvalidOption (CONVENTIONS §2).
func TestR18iHopMarginMustLeaveTimeInTheAttempt(t *testing.T) {
	for name, opts := range map[string][]interceptor.ClientOption{
		"margin above timeout": {interceptor.WithHopMargin(time.Hour), interceptor.WithAttemptTimeout(time.Second)},
		"margin = timeout":     {interceptor.WithHopMargin(time.Second), interceptor.WithAttemptTimeout(time.Second)},
		"margin + min try":     {interceptor.WithHopMargin(600 * time.Millisecond), interceptor.WithMinTryTime(400 * time.Millisecond), interceptor.WithAttemptTimeout(time.Second)},
		"default timeout set":  {interceptor.WithHopMargin(interceptor.DefaultAttemptTimeout), interceptor.WithAttemptTimeout(interceptor.DefaultAttemptTimeout)},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := interceptor.NewDialOptions(opts...)
			require.ErrorIs(t, err, interceptor.ErrInvalidOption)
			require.ErrorContains(t, err, "hop margin")
		})
	}
	_, err := interceptor.NewDialOptions(interceptor.WithHopMargin(500*time.Millisecond), interceptor.WithAttemptTimeout(time.Second))
	require.NoError(t, err)
}

// WithDefaultServiceConfig("{not json") passed NewDialOptions, although its
// doc says it checks the config, and failed only at grpc.NewClient. A
// config that is not a JSON object is ErrInvalidOption.
func TestR18iDefaultServiceConfigIsChecked(t *testing.T) {
	for _, cfg := range []string{"{not json", "[]", `"x"`, "{} {}", "null"} {
		_, err := interceptor.NewDialOptions(interceptor.WithDefaultServiceConfig(cfg))
		require.ErrorIs(t, err, interceptor.ErrInvalidOption, cfg)
		require.ErrorContains(t, err, "service config", cfg)
	}
	for _, cfg := range []string{"{}", `{"loadBalancingConfig":[{"round_robin":{}}]}`} {
		_, err := interceptor.NewDialOptions(interceptor.WithDefaultServiceConfig(cfg))
		require.NoError(t, err, cfg)
	}
}

// WithServerTracerProvider was a deprecated option with no effect: a trap
// in an unpublished v0 module. The package exports nothing deprecated.
func TestR18iNothingDeprecated(t *testing.T) {
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, parser.ParseComments|parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, cg := range f.Comments {
			require.NotContains(t, cg.Text(), "Deprecated:", "%s: %s", e.Name(), fset.Position(cg.Pos()))
		}
	}
}

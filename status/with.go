package status

import "errors"

// With returns a copy of the *Error in err's chain with opts applied (for
// example to name the attempt, call and try a refusal answers), and err
// unchanged when its chain holds no *Error. The copy keeps the original's
// code, outcome, reason, cause and carried details; a WithMessage option
// appends to the message.
//
// The copy's message is err's text, err.Error(), which is what grpc-go
// sends as the status message of err: the *Error's own message, and the
// text of what wraps it (a fmt.Errorf("reserve: %w", …) prefix). What wraps
// it is otherwise not kept — errors.Is and errors.As no longer find the
// other errors of err's chain — but for a [WithoutEffect] that encloses the
// *Error when that *Error decides err's status, which the copy keeps:
// With(WithoutEffect(na), …) is WithoutEffect of the copy, and
// [HandlerOutcome] still reads it NOT_ADMITTED. A WithoutEffect over
// another status (one that errors.As looks past to find the *Error) is
// not kept: HandlerOutcome reads err UNKNOWN, and the copy so too.
func With(err error, opts ...Option) error {
	var te *Error
	if !errors.As(err, &te) || te == nil {
		return err
	}
	msg := te.msg
	if err != error(te) {
		msg = err.Error()
	}
	e := &Error{code: te.code, msg: msg, cause: te.cause, outcome: te.outcome, reason: te.reason, f: te.f, carried: te.carried}
	e.f.Message = ""
	e = build(e, opts, true, true)
	if withoutEffectOf(err, te) {
		return WithoutEffect(e)
	}
	return e
}

// withoutEffectOf reports whether [HandlerOutcome] reads err as enclosed by
// a WithoutEffect wrapper, and te is the error that decides err's status:
// only then is the copy of te what err reads as. A WithoutEffect over
// another status (an errors.Join whose first branch is a callee's INTERNAL,
// a status error type that keeps te as its cause) is not a declaration
// about te, and err reads UNKNOWN.
func withoutEffectOf(err error, te *Error) bool {
	x := inspect(err)
	return x.withoutEffect && x.te == te
}

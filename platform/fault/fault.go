// Package fault is Better Compute's one error type: every error that crosses a
// package boundary carries a stable Code that callers, workers and the CLI can
// test, a message that is safe to show (it never holds a password), and the
// cause behind Unwrap.
//
// Codes are the contract of shared/DESIGN.md:
//
//	INVALID_CONFIG    the deployment is wrong: a setting, a migration set, a ledger
//	INVALID_ARGUMENT  the caller is wrong: bad input, a clock moved backwards
//	NOT_FOUND         the named thing does not exist
//	CONFLICT          a guard refused the change: a concurrent writer won, a duplicate
//	FENCED            the caller's lease or job attempt is no longer current
//	CLOCK_SKEW        this process's clock drifted more than 1 s from the database's
//	UNAVAILABLE       the database (or another dependency) cannot be reached now
//	INTERNAL_ERROR    anything else, including a COMMIT the server turned into a ROLLBACK
//
// Anything that is not a *Error reads as INTERNAL_ERROR (see CodeOf).
package fault

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable error code.
type Code string

// The codes. Their string values never change: scripts and alerts match on them.
const (
	InvalidConfig   Code = "INVALID_CONFIG"
	InvalidArgument Code = "INVALID_ARGUMENT"
	NotFound        Code = "NOT_FOUND"
	Conflict        Code = "CONFLICT"
	Fenced          Code = "FENCED"
	ClockSkew       Code = "CLOCK_SKEW"
	Unavailable     Code = "UNAVAILABLE"
	Internal        Code = "INTERNAL_ERROR"
)

// Error is an error with a stable code.
type Error struct {
	Code    Code
	Message string // safe to show to an operator
	Err     error  // the cause, if any
}

// Error formats the error as "CODE: message: cause".
func (e *Error) Error() string {
	switch {
	case e.Err != nil && e.Message != "":
		return string(e.Code) + ": " + e.Message + ": " + e.Err.Error()
	case e.Err != nil:
		return string(e.Code) + ": " + e.Err.Error()
	default:
		return string(e.Code) + ": " + e.Message
	}
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is lets errors.Is match any *Error of the same code:
//
//	errors.Is(err, &fault.Error{Code: fault.Fenced})
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Err == nil && t.Code == e.Code
}

// New returns an error with code and a formatted message.
func New(code Code, format string, args ...any) error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an error with code, a formatted message and cause err. A nil err
// returns nil.
func Wrap(code Code, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Err: err}
}

// CodeOf returns the code of the first *Error in err's chain, "" for nil, and
// INTERNAL_ERROR for an error that carries no code.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Internal
}

// Has reports whether err carries code.
func Has(err error, code Code) bool { return err != nil && CodeOf(err) == code }

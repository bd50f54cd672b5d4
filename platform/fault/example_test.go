package fault_test

import (
	"errors"
	"fmt"
	"io"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// An error is a code a caller tests and a message an operator reads; the
// message never holds a secret.
func ExampleNew() {
	err := fault.New(fault.InvalidArgument, "CENTS %q is not a whole number", "12.5")
	fmt.Println(err)
	fmt.Println(fault.Has(err, fault.InvalidArgument))
	// Output:
	// INVALID_ARGUMENT: CENTS "12.5" is not a whole number
	// true
}

// Wrap keeps the cause behind Unwrap, and its message after the code's.
func ExampleWrap() {
	err := fault.Wrap(fault.Unavailable, io.ErrUnexpectedEOF, "error reading order %s", "o-1")
	fmt.Println(err)
	fmt.Println(errors.Is(err, io.ErrUnexpectedEOF))
	fmt.Println(fault.Wrap(fault.Unavailable, nil, "nothing to wrap"))
	// Output:
	// UNAVAILABLE: error reading order o-1: unexpected EOF
	// true
	// <nil>
}

// CodeOf reads the code of the first *fault.Error in the chain, however
// deeply wrapped; an error without one is INTERNAL_ERROR.
func ExampleCodeOf() {
	conflict := fault.New(fault.Conflict, "workflow o-1 is completed: it takes no more signals")
	wrapped := fmt.Errorf("paying order o-1: %w", conflict)
	fmt.Println(fault.CodeOf(wrapped))
	fmt.Println(fault.CodeOf(errors.New("no code")))
	fmt.Printf("%q\n", fault.CodeOf(nil))
	// errors.Is matches any error of a code, too.
	fmt.Println(errors.Is(wrapped, &fault.Error{Code: fault.Conflict}))
	// Output:
	// CONFLICT
	// INTERNAL_ERROR
	// ""
	// true
}

package fault_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bettercompute/bettercompute/platform/fault"
)

// TestCodesAreStable: the codes' strings are the contract scripts and alerts
// match on (docs/operating.md, Configuration): they never change.
func TestCodesAreStable(t *testing.T) {
	t.Parallel()
	for code, want := range map[fault.Code]string{
		fault.InvalidConfig:   "INVALID_CONFIG",
		fault.InvalidArgument: "INVALID_ARGUMENT",
		fault.NotFound:        "NOT_FOUND",
		fault.Conflict:        "CONFLICT",
		fault.Fenced:          "FENCED",
		fault.ClockSkew:       "CLOCK_SKEW",
		fault.Unavailable:     "UNAVAILABLE",
		fault.Internal:        "INTERNAL_ERROR",
	} {
		require.Equal(t, want, string(code))
	}
}

// TestErrorText: an error reads "CODE: message: cause", without the parts it
// lacks, and New formats its message.
func TestErrorText(t *testing.T) {
	t.Parallel()
	cause := errors.New("connection reset")
	require.Equal(t, "FENCED: job 7: lease shard/1 lost", fault.New(fault.Fenced, "job %d: lease %s lost", 7, "shard/1").Error())
	require.Equal(t, "UNAVAILABLE: reading: connection reset", fault.Wrap(fault.Unavailable, cause, "reading").Error())
	require.Equal(t, "UNAVAILABLE: connection reset", (&fault.Error{Code: fault.Unavailable, Err: cause}).Error())
	require.NoError(t, fault.Wrap(fault.Internal, nil, "nothing went wrong"), "Wrap of nil is nil")
}

// TestCodeThroughWrapping: a code survives any number of fmt.Errorf %w layers,
// for CodeOf, Has, errors.Is (any *Error of the same code, as the package doc
// says) and errors.As; the cause behind a fault stays reachable; an error without
// a code is INTERNAL_ERROR and nil has no code.
func TestCodeThroughWrapping(t *testing.T) {
	t.Parallel()
	cause := context.DeadlineExceeded
	inner := fault.Wrap(fault.Fenced, cause, "job %d", 7)
	err := fmt.Errorf("outer: %w", fmt.Errorf("middle: %w", inner))

	require.Equal(t, fault.Fenced, fault.CodeOf(err))
	require.True(t, fault.Has(err, fault.Fenced))
	require.False(t, fault.Has(err, fault.Conflict))
	require.ErrorIs(t, err, &fault.Error{Code: fault.Fenced})
	require.NotErrorIs(t, err, &fault.Error{Code: fault.Conflict})
	require.NotErrorIs(t, err, &fault.Error{Code: fault.Fenced, Message: "job 7"},
		"a target with a message is not a code pattern: only the same pointer matches it")
	require.ErrorIs(t, err, inner)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the cause is behind Unwrap")
	var fe *fault.Error
	require.ErrorAs(t, err, &fe)
	require.Equal(t, fault.Fenced, fe.Code)
	require.Equal(t, "job 7", fe.Message)

	// The first code in the chain wins: a wrapper's code over its cause's.
	outer := fault.Wrap(fault.Unavailable, fmt.Errorf("x: %w", fault.New(fault.Conflict, "y")), "z")
	require.Equal(t, fault.Unavailable, fault.CodeOf(outer))
	require.ErrorIs(t, outer, &fault.Error{Code: fault.Conflict}, "the cause's code is still matched by errors.Is")

	require.Equal(t, fault.Internal, fault.CodeOf(errors.New("plain")))
	require.Equal(t, fault.Internal, fault.CodeOf(fmt.Errorf("wrapped: %w", errors.New("plain"))))
	require.True(t, fault.Has(errors.New("plain"), fault.Internal))
	require.Equal(t, fault.Code(""), fault.CodeOf(nil))
	require.False(t, fault.Has(nil, fault.Internal))
}

package workflow_test

import (
	"testing"

	"github.com/bettercompute/bettercompute/platform/pgtest"
)

// TestMain stops the embedded PostgreSQL the examples start, and drops their
// databases.
func TestMain(m *testing.M) { pgtest.Main(m) }

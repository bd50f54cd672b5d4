package tenancy_test

import (
	"testing"

	"github.com/bettercompute/bettercompute/platform/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

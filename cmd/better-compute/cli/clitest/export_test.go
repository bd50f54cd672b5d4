package clitest

import "time"

// SetTimeout changes k's Wait timeout, so a test can watch a Wait helper fail
// without waiting for the default.
func SetTimeout(k *Kit, d time.Duration) { k.timeout = d }

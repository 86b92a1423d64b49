package main

import (
	"os"
	"testing"
)

// TestMain lets the test binary serve as replay --busy's child, as the
// command's own binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == busyCommand {
		os.Exit(busyMain())
	}
	// A quiet machine for the verdicts, whatever else runs beside the
	// tests (TestReplayCheck sets a busy one).
	loadAverage = func() float64 { return 0.5 }
	os.Exit(m.Run())
}

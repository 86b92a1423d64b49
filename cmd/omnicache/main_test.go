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
	os.Exit(m.Run())
}

//go:build !amd64 || purego || noasm

package spin

// Impl names the implementation Pause runs.
const Impl = "go"

// Pause is the spin-wait hint's stand-in here: n atomic loads (none for n <= 0).
func Pause(n int) { pauseGo(n) }

//go:build amd64 && !purego && !noasm

package spin

// Impl names the implementation Pause runs.
const Impl = "asm"

// Pause executes the spin-wait hint n times (none for n <= 0).
func Pause(n int) {
	if n > 0 {
		pause(n)
	}
}

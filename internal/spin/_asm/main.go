// Command _asm generates the spin-wait kernel of package spin
// (pause_amd64.s and pause_stubs_amd64.go) with avo. Run it through
// `make generate`; `make check-generate` fails when the committed files drift.
//
// pause(n) executes PAUSE n times (n > 0). PAUSE is the spin-wait hint: it
// delays the next instruction (about 10 cycles before Skylake, about 140
// since), keeps the core from speculating ahead through the loads of the
// spin (whose memory-order machine clear would otherwise end the spin when
// the awaited store lands), and leaves the core's execution resources to
// the other hardware thread sharing it, whose work the spin waits for.
package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
)

func main() {
	ConstraintExpr("amd64,!purego,!noasm")
	TEXT("pause", NOSPLIT, "func(n int)")
	Doc("pause executes the PAUSE spin-wait hint n times (n > 0).")
	n := Load(Param("n"), GP64())
	Label("loop")
	PAUSE()
	DECQ(n)
	JNZ(LabelRef("loop"))
	RET()
	Generate()
}

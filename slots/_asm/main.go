// Command _asm generates the AVX2 and AVX-512 kernels of package slots
// (slots_amd64.s and slots_stubs_amd64.go) with avo. Run it through
// `make generate`; `make check-generate` fails when the committed files drift.
//
// # The algorithm
//
// A step's batch is a list of requests (row, start, count) and a block table
// (Stride block ids per row). Position pos of a request lives in slot
// Table[row*Stride + pos/bs]*bs + pos%bs, bs the block size. All arithmetic is
// int32 and wraps. Go has checked the block size, Stride and the table's
// length (below 2^31, so that 32-bit gather indexes hold every entry).
//
// Check. One pass over the requests, a vector (16 lanes AVX-512, 8 AVX2) at a
// time, the last partial vector loaded with a mask (its empty lanes read as
// zeros and pass). A request is bad when the sign bit of
// row | (nrows-1-row) | start | count is set (a negative row, start or count,
// or a row past the table), or when count > 0 and positions-start < count
// (start+count past the positions a row holds; the difference cannot
// overflow). Arithmetic and ternary-logic ORs keep port 5 free of compares.
// The counts are summed in 64-bit lanes, even and odd lanes apart. The kernel
// returns the sum, or -1 for a bad batch, and Go then words the error.
//
// Map. Decode steps schedule one token per request. While a whole vector of
// requests all have count 1, it is mapped at once: column = start/bs and
// offset = start%bs (a shift and a mask for a power-of-two bs; otherwise a
// multiply by 1/bs in float64, truncated, and one correction step, exact for
// starts below 2^31), index = row*Stride + column, a gather of the block ids,
// slot = block*bs + offset, one store; the pointers advance by constants, so
// the next vector's loads do not wait for this one. Otherwise the leading
// run of count-1 lanes (a compare, a mask, a count of trailing zeros) is
// mapped the same way with masked loads and a masked store, and the request
// that ended the run (count 0, or a prefill chunk) is mapped alone:
//
//   - bs below the lane count: a vector of consecutive positions at a time,
//     split like the decodes, a gather of their block ids;
//   - otherwise block by block: the first block from the start's offset,
//     then whole blocks, then a partial last block. A block is a run of
//     consecutive slots: broadcast(block*bs + offset) + iota, written in
//     whole vector stores and a masked store for the remainder. Whole blocks
//     of one or two vectors (bs 16 or 32 with AVX-512, 8 or 16 with AVX2)
//     take a loop unrolled four blocks deep; other multiples of the lane
//     count a tight loop of full stores.
//
// Expand. A hit span is a request that starts at position 0 of its own block
// list: the same runs, from offset 0.
//
// Memory: masked loads and stores never touch memory past the slices'
// lengths (the AVX-512 opmask and AVX2 VPMASKMOVD suppress faults on
// masked-off lanes). There is no global data: the iota vector is built from
// immediates, so no global access clobbers R15 when dynamic linking, and the
// kernels may use every register. Only VEX and EVEX instructions are used
// (a legacy SSE MOVSD cost ~200ns a call, measured) and every kernel ends with
// VZEROUPPER.
//
// Instruction families, as the "Requires:" comments of the output list them:
// AVX-512 kernels use AVX512F (AVX512VL where the assembler gives xmm/ymm
// instructions on registers 16-31 their EVEX forms), AVX, AVX2, BMI1 (TZCNT)
// and BMI2 (BZHI, SHRX); AVX2 kernels use AVX, AVX2, BMI1 and BMI2. Both use
// CMOV. slots_amd64.go gates every one of them.
package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

func main() {
	ConstraintExpr("amd64,!purego,!noasm")

	for _, v := range []isa{avx512, avx2} {
		genCheck(v)
		genMap(v, false)
		genMap(v, true)
		genExpand(v, false)
		genExpand(v, true)
	}
	Generate()
}

// isa abstracts the vector width: the AVX-512 kernels use zmm registers and
// opmasks, the AVX2 kernels ymm registers and mask vectors.
type isa struct {
	name  string // function name suffix
	lanes int    // int32 lanes per vector
}

var (
	avx512 = isa{name: "AVX512", lanes: 16}
	avx2   = isa{name: "AVX2", lanes: 8}
)

func (v isa) vec() VecVirtual {
	if v.lanes == 16 {
		return ZMM()
	}
	return YMM()
}

// labelCount numbers the labels, so that each is unique in the file.
var labelCount int

// label returns a new label name.
func label(name string) string {
	labelCount++
	return fmt.Sprintf("%s_%d", name, labelCount)
}

// zero returns a zeroed vector.
func (v isa) zero() VecVirtual {
	x := v.vec()
	if v.lanes == 16 {
		VPXORD(x, x, x)
	} else {
		VPXOR(x, x, x)
	}
	return x
}

// broadcast returns a vector with r's low 32 bits in every lane.
func (v isa) broadcast(r GP) VecVirtual {
	x := v.vec()
	if v.lanes == 16 {
		VPBROADCASTD(r.As32(), x)
	} else {
		VMOVD(r.As32(), x.AsX())
		VPBROADCASTD(x.AsX(), x)
	}
	return x
}

// broadcastImm returns a vector with c in every lane.
func (v isa) broadcastImm(c uint32) VecVirtual {
	r := GP32()
	MOVL(U32(c), r)
	return v.broadcast(r)
}

// minLanes returns min(rem, lanes) in a new register.
func (v isa) minLanes(rem GPVirtual) GPVirtual {
	n := GP64()
	MOVQ(U32(v.lanes), n)
	CMPQ(rem, n)
	CMOVQLT(rem, n)
	return n
}

// kmask returns an opmask with the low n bits set (0 <= n <= 16).
func kmask(n GP) Op {
	t := GP32()
	MOVL(U32(0xffff), t)
	BZHIL(n.As32(), t, t)
	k := K()
	KMOVW(t, k)
	return k
}

// iota returns the vector 0, 1, 2, ... lanes-1. It is built from
// immediates, not loaded from a global: a global access would clobber R15
// when dynamic linking, and the kernels use every register.
func (v isa) iota() VecVirtual {
	r := GP64()
	MOVQ(U64(0x0706050403020100), r)
	x := XMM()
	VMOVQ(r, x)
	y := v.vec()
	if v.lanes == 16 {
		MOVQ(U64(0x0f0e0d0c0b0a0908), r)
		VPINSRQ(U8(1), r, x, x)
	}
	VPMOVZXBD(x, y)
	return y
}

// ymask returns a vector whose low n lanes are all ones (0 <= n <= 8), given
// the AVX2 iota vector.
func ymask(n GP, iota8 VecVirtual) VecVirtual {
	y := avx2.broadcast(n)
	VPCMPGTD(iota8, y, y)
	return y
}

// at returns the memory operand p + 4*i.
func at(p, i Register) Mem { return Mem{Base: p, Index: i, Scale: 4} }

// genMap emits map<Pow2|Div><ISA>.
func genMap(v isa, div bool) {
	name := "mapPow2" + v.name
	sig := "func(dst, rows, start, count *int32, n int, table *int32, stride, blockSize int)"
	doc := "for a power-of-two blockSize"
	if div {
		name = "mapDiv" + v.name
		sig = "func(dst, rows, start, count *int32, n int, table *int32, stride, blockSize int, recip float64)"
		doc = "for any blockSize >= 2 (recip = 1/blockSize)"
	}
	TEXT(name, NOSPLIT, sig)
	Doc(name+" writes the slots of n checked requests (n > 0) to dst, "+doc+".",
		"Table indexes must fit in an int32.")
	o := param("dst")
	rows := param("rows")
	start := param("start")
	count := param("count")
	rem := param("n")
	table := param("table")
	stride := param("stride")
	bs := param("blockSize")
	k := newKernel(v, div, o, bs)
	k.decodeSetup()
	vStride := v.broadcast(stride)

	loop, general, scalar, next, done := label("loop"), label("general"), label("scalar"), label("next"), label("done")
	Label(loop)
	Comment("a whole vector of decodes (count 1): the common case, whose pointer")
	Comment("updates are constants so that iterations overlap")
	CMPQ(rem, U8(v.lanes))
	JB(LabelRef(general))
	{
		s, idx, g := v.vec(), v.vec(), v.vec()
		if v.lanes == 16 {
			all := K()
			VPCMPEQD(Mem{Base: count}, k.one, all)
			KORTESTW(all, all)
			JCC(LabelRef(general))
			VMOVDQU32(Mem{Base: start}, s)
			VPMULLD(Mem{Base: rows}, vStride, idx)
		} else {
			c, t := YMM(), GP32()
			VPCMPEQD(Mem{Base: count}, k.one, c)
			VMOVMSKPS(c, t)
			CMPL(t, U8(0xff))
			JNE(LabelRef(general))
			VMOVDQU(Mem{Base: start}, s)
			VPMULLD(Mem{Base: rows}, vStride, idx)
		}
		col, off := k.divmod(s)
		VPADDD(col, idx, idx)
		if v.lanes == 16 {
			gm := K()
			KXNORW(gm, gm, gm)
			VPXORD(g, g, g)
			VPGATHERDD(Mem{Base: table, Index: idx, Scale: 4}, gm, g)
			k.slots(g, off)
			VMOVDQU32(g, Mem{Base: o})
		} else {
			gm := YMM()
			VPCMPEQD(gm, gm, gm)
			VPXOR(g, g, g)
			VPGATHERDD(gm, Mem{Base: table, Index: idx, Scale: 4}, g)
			k.slots(g, off)
			VMOVDQU(g, Mem{Base: o})
		}
		for _, p := range []GPVirtual{o, rows, start, count} {
			ADDQ(U8(4*v.lanes), p)
		}
		SUBQ(U8(v.lanes), rem)
		JMP(LabelRef(loop))
	}

	Label(general)
	TESTQ(rem, rem)
	JLE(LabelRef(done))
	Comment("j = the number of leading requests with count 1 (decodes), < lanes here")
	j := GP64()
	var run Op // mask of the j decodes
	var runV VecVirtual
	if v.lanes == 16 {
		valid := kmask(v.minLanes(rem))
		c := ZMM()
		VMOVDQU32_Z(Mem{Base: count}, valid, c)
		ones := K()
		VPCMPEQD(k.one, c, valid, ones)
		KMOVW(ones, j.As32())
	} else {
		valid := ymask(v.minLanes(rem), k.iota)
		c := YMM()
		VPMASKMOVD(Mem{Base: count}, valid, c)
		VPCMPEQD(k.one, c, c)
		VPAND(valid, c, c)
		VMOVMSKPS(c, j.As32())
	}
	NOTL(j.As32())
	TZCNTL(j.As32(), j.As32())
	TESTL(j.As32(), j.As32())
	JZ(LabelRef(scalar))

	Comment("map the j decodes: gather one block id each")
	s, idx := v.vec(), v.vec()
	var g VecVirtual
	if v.lanes == 16 {
		run = kmask(j)
		VMOVDQU32_Z(Mem{Base: start}, run, s)
		VPMULLD_Z(Mem{Base: rows}, vStride, run, idx)
	} else {
		runV = ymask(j, k.iota)
		VPMASKMOVD(Mem{Base: start}, runV, s)
		VPMASKMOVD(Mem{Base: rows}, runV, idx)
		VPMULLD(vStride, idx, idx)
	}
	col, off := k.divmod(s)
	VPADDD(col, idx, idx)
	g = v.zero()
	if v.lanes == 16 {
		gm := K()
		KMOVW(run, gm)
		VPGATHERDD(Mem{Base: table, Index: idx, Scale: 4}, gm, g)
		k.slots(g, off)
		VMOVDQU32(g, run, Mem{Base: o})
	} else {
		gm := YMM()
		VMOVDQA(runV, gm)
		VPGATHERDD(gm, Mem{Base: table, Index: idx, Scale: 4}, g)
		k.slots(g, off)
		VPMASKMOVD(g, runV, Mem{Base: o})
	}
	LEAQ(at(o, j), o)
	LEAQ(at(rows, j), rows)
	LEAQ(at(start, j), start)
	LEAQ(at(count, j), count)
	SUBQ(j, rem)

	Comment("the next request is not a decode (or there is none)")
	Label(scalar)
	TESTQ(rem, rem)
	JLE(LabelRef(done))
	cnt := GP64()
	MOVL(Mem{Base: count}, cnt.As32())
	TESTQ(cnt, cnt)
	JZ(LabelRef(next))
	sv := GP64()
	MOVL(Mem{Base: start}, sv.As32())
	r := GP64()
	MOVL(Mem{Base: rows}, r.As32())
	IMULQ(stride, r)
	small := label("small")
	CMPQ(bs, U8(v.lanes))
	JB(LabelRef(small))
	scol, soff := k.scalarDivmod(sv)
	ADDQ(scol, r)
	tp := GP64()
	LEAQ(at(table, r), tp)
	k.blocks(tp, soff, cnt)
	JMP(LabelRef(next))
	Label(small)
	k.gatherRun(table, r, sv, cnt)
	Label(next)
	ADDQ(U8(4), rows)
	ADDQ(U8(4), start)
	ADDQ(U8(4), count)
	DECQ(rem)
	JMP(LabelRef(loop))

	Label(done)
	VZEROUPPER()
	RET()
}

// genExpand emits expand<Pow2|Div><ISA>.
func genExpand(v isa, div bool) {
	name := "expandPow2" + v.name
	sig := "func(dst, blocks *int32, tokens, blockSize int)"
	doc := "for a power-of-two blockSize"
	if div {
		name = "expandDiv" + v.name
		sig = "func(dst, blocks *int32, tokens, blockSize int, recip float64)"
		doc = "for any blockSize >= 2 (recip = 1/blockSize)"
	}
	TEXT(name, NOSPLIT, sig)
	Doc(name+" writes the slots of positions [0, tokens) over blocks, "+doc+".",
		"0 < tokens <= math.MaxInt32.")
	o := param("dst")
	tp := param("blocks")
	c := param("tokens")
	bs := param("blockSize")
	k := newKernel(v, div, o, bs)
	small, end := label("small"), label("end")
	zero := GP64()
	XORQ(zero, zero)
	CMPQ(bs, U8(v.lanes))
	JB(LabelRef(small))
	k.blocks(tp, zero, c)
	JMP(LabelRef(end))
	Label(small)
	k.decodeSetup()
	k.gatherRun(tp, zero, zero, c)
	Label(end)
	VZEROUPPER()
	RET()
}

// gatherRun writes c (> 0) slots of consecutive positions s, s+1, ... of the
// request whose table row starts at table + 4*base, a vector of positions at
// a time: columns and offsets by divmod, one gather of the block ids. For
// block sizes below the lane count, where a block is less than a store.
// Needs decodeSetup.
func (k *kernel) gatherRun(table, base, s, c GPVirtual) {
	v := k.v
	loop, tail, end := label("gloop"), label("gtail"), label("gend")
	Commentf("block size < %d: a gather per vector of positions", v.lanes)
	vbase := v.broadcast(base)
	pos := v.broadcast(s)
	VPADDD(k.iota, pos, pos)
	one := func(n GPVirtual) {
		col, off := k.divmod(pos)
		VPADDD(vbase, col, col)
		g := v.zero()
		if v.lanes == 16 {
			var run Op
			gm := K()
			if n == nil {
				KXNORW(gm, gm, gm)
			} else {
				run = kmask(n)
				KMOVW(run, gm)
			}
			VPGATHERDD(Mem{Base: table, Index: col, Scale: 4}, gm, g)
			k.slots(g, off)
			if n == nil {
				VMOVDQU32(g, Mem{Base: k.o})
			} else {
				VMOVDQU32(g, run, Mem{Base: k.o})
			}
			return
		}
		gm := YMM()
		var run VecVirtual
		if n == nil {
			VPCMPEQD(gm, gm, gm)
		} else {
			run = ymask(n, k.iota)
			VMOVDQA(run, gm)
		}
		VPGATHERDD(gm, Mem{Base: table, Index: col, Scale: 4}, g)
		k.slots(g, off)
		if n == nil {
			VMOVDQU(g, Mem{Base: k.o})
		} else {
			VPMASKMOVD(g, run, Mem{Base: k.o})
		}
	}
	Label(loop)
	CMPQ(c, U8(v.lanes))
	JB(LabelRef(tail))
	one(nil)
	VPADDD(k.step, pos, pos)
	ADDQ(U8(4*v.lanes), k.o)
	SUBQ(U8(v.lanes), c)
	JMP(LabelRef(loop))
	Label(tail)
	TESTQ(c, c)
	JZ(LabelRef(end))
	one(c)
	LEAQ(at(k.o, c), k.o)
	Label(end)
}

// param loads the named integer or pointer argument into a new register.
func param(name string) GPVirtual {
	r := GP64()
	Load(Param(name), r)
	return r
}

// wholeBlocks emits the loop for whole blocks when bs is u vectors: four
// blocks an iteration, then one at a time, then a jump to tail. It starts at
// label name, with c >= bs.
func (k *kernel) wholeBlocks(name string, u int, tp, c GPVirtual, tail string) {
	lanes := k.v.lanes
	bs := u * lanes
	four, one := label("four"), label("one")
	Commentf("whole blocks, bs = %d: unrolled full stores", bs)
	Label(name)
	CMPQ(c, U32(4*bs))
	JB(LabelRef(one))
	Label(four)
	var x [4]VecVirtual
	for b := range x {
		x[b] = k.v.vec()
		VPBROADCASTD(Mem{Base: tp, Disp: 4 * b}, x[b])
		VPMULLD(k.xbs, x[b], x[b])
		VPADDD(k.iota, x[b], x[b])
	}
	for b := range x {
		for j := 0; j < u; j++ {
			if j > 0 {
				VPADDD(k.step, x[b], x[b])
			}
			k.storeAt(x[b], 4*lanes*(b*u+j))
		}
	}
	ADDQ(U32(4*4*bs), k.o)
	ADDQ(U8(16), tp)
	SUBQ(U32(4*bs), c)
	CMPQ(c, U32(4*bs))
	JAE(LabelRef(four))
	CMPQ(c, U32(bs))
	JB(LabelRef(tail))
	Label(one)
	y := k.v.vec()
	VPBROADCASTD(Mem{Base: tp}, y)
	VPMULLD(k.xbs, y, y)
	VPADDD(k.iota, y, y)
	for j := 0; j < u; j++ {
		if j > 0 {
			VPADDD(k.step, y, y)
		}
		k.storeAt(y, 4*lanes*j)
	}
	ADDQ(U32(4*bs), k.o)
	ADDQ(U8(4), tp)
	SUBQ(U32(bs), c)
	CMPQ(c, U32(bs))
	JAE(LabelRef(one))
	JMP(LabelRef(tail))
}

// storeAt stores x at o + disp.
func (k *kernel) storeAt(x VecVirtual, disp int) {
	if k.v.lanes == 16 {
		VMOVDQU32(x, Mem{Base: k.o, Disp: disp})
	} else {
		VMOVDQU(x, Mem{Base: k.o, Disp: disp})
	}
}
